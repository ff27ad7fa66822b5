package domain_test

import (
	"encoding/json"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/yourorg/orders/internal/domain"
)

// examples holds one payload of every message type, with every field set.
// A new message type comes with its example here (README.md, "Use it as a
// template"): TestEveryMessageTypeHasAnExample fails until it has one.
var examples = map[string]domain.Message{
	domain.TypeOrderSubmitted: domain.OrderSubmittedV1{
		ID: exampleOrderID, CustomerID: "c-1", Currency: "EUR", TotalCents: 2500,
		Items: []domain.ItemLine{{SKU: "A-1", Quantity: 2, UnitPriceCents: 1250}},
	},
	domain.TypeFulfillmentRequested: domain.FulfillmentRequestedV1{
		ID: exampleOrderID, Items: []domain.ItemLine{{SKU: "A-1", Quantity: 2, UnitPriceCents: 1250}},
	},
	domain.TypeFulfillmentCompleted: domain.FulfillmentCompletedV1{ID: exampleOrderID, ReservationID: uuid.MustParse("0193a3c4-2f6e-7d1a-9b3c-4d5e6f708192")},
	domain.TypeFulfillmentRejected:  domain.FulfillmentRejectedV1{ID: exampleOrderID, Reason: "out of stock", SKUs: []string{"OOS-1"}},
	domain.TypeOrderCancelled:       domain.OrderCancelledV1{ID: exampleOrderID},
	domain.TypeOrderFulfilled:       domain.OrderFulfilledV1{ID: exampleOrderID},
	domain.TypeOrderRejected:        domain.OrderRejectedV1{ID: exampleOrderID, Reason: "out of stock"},
}

var exampleOrderID = uuid.MustParse("0193a3c4-2f6e-7d1a-9b3c-4d5e6f708190")

// Every message type has an example, with every field set, that survives
// the trip through JSON and DecodeMessage unchanged and carries order_id:
// the decoder is registered under the right type and version, and every
// field has a JSON name that reads back.
func TestEveryMessageTypeHasAnExample(t *testing.T) {
	t.Parallel()
	types := domain.MessageTypes()
	if len(types) == 0 {
		t.Fatal("MessageTypes() is empty")
	}
	for _, typ := range types {
		m, ok := examples[typ]
		if !ok {
			t.Errorf("%s has no example in examples (catalog_test.go)", typ)
			continue
		}
		if m.MessageType() != typ {
			t.Errorf("the example of %s is a %T, whose type is %s", typ, m, m.MessageType())
			continue
		}
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
	for typ := range examples {
		if !slices.Contains(types, typ) {
			t.Errorf("examples has %s, which is not in MessageTypes() (no reader for it in messages.go)", typ)
		}
	}
}

// Every message type is named, in backticks, in docs/messaging.md.
func TestEveryMessageTypeIsDocumented(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../../docs/messaging.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, typ := range domain.MessageTypes() {
		if !strings.Contains(string(doc), "`"+typ+"`") {
			t.Errorf("docs/messaging.md does not name `%s`", typ)
		}
	}
}
