package domain_test

import (
	"encoding/json"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/yourorg/orders/internal/domain"
)

// Every message type has an example in the catalogue, with every field
// set, that survives the trip through JSON and DecodeMessage unchanged and
// carries order_id: the decoder is registered under the right type and
// version, and every field has a JSON name that reads back.
func TestEveryMessageTypeHasAnExample(t *testing.T) {
	t.Parallel()
	types := domain.MessageTypes()
	if len(types) == 0 {
		t.Fatal("MessageTypes() is empty")
	}
	seen := map[string]bool{}
	for _, m := range domain.Examples() {
		typ := m.MessageType()
		seen[typ] = true
		v := reflect.ValueOf(m)
		for i := range v.NumField() {
			if v.Field(i).IsZero() {
				t.Errorf("the example of %s leaves %s empty: set every field, so that each is checked", typ, v.Type().Field(i).Name)
			}
		}
		body, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		var fields map[string]any
		if err := json.Unmarshal(body, &fields); err != nil {
			t.Fatal(err)
		}
		if fields["order_id"] != m.OrderID().String() {
			t.Errorf("%s: the payload %s does not carry order_id %s", typ, body, m.OrderID())
		}
		got, err := domain.DecodeMessage(typ, m.MessageVersion(), body)
		if err != nil {
			t.Errorf("%s version %d does not decode its example: %v", typ, m.MessageVersion(), err)
			continue
		}
		if !reflect.DeepEqual(got, m) {
			t.Errorf("%s: decoded %#v, want %#v", typ, got, m)
		}
	}
	for _, typ := range types {
		if !seen[typ] {
			t.Errorf("%s has no example in the catalogue (messages.go)", typ)
		}
	}
}

// Every message type is named, in backticks, in docs/catalog.md (which
// `make generate` writes from the catalogue; TestCatalogPageIsCurrent in
// api/internal/gen keeps it current).
func TestEveryMessageTypeIsDocumented(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../../docs/catalog.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, typ := range domain.MessageTypes() {
		if !strings.Contains(string(doc), "`"+typ+"`") {
			t.Errorf("docs/catalog.md does not name `%s`: run make generate", typ)
		}
	}
}
