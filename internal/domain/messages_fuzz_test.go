package domain_test

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/yourorg/orders/internal/domain"
)

// The payload decoder of every (type, version) of the catalogue, on any
// body: entry picks the catalogue entry (domain.Examples, modulo their
// number). DecodeMessage never panics; a refusal is an
// ErrMalformedMessage naming the type; a payload it accepts is one JSON
// value of the entry's type and version, has an order_id, and once re-encoded reads
// back to the same encoding. The seed corpus (testdata/fuzz/FuzzDecodeMessage) runs with
// every go test; `go test -fuzz FuzzDecodeMessage` explores from it.
func FuzzDecodeMessage(f *testing.F) {
	examples := domain.Examples()
	f.Fuzz(func(t *testing.T, entry uint8, body []byte) {
		want := examples[int(entry)%len(examples)]
		typ, version := want.MessageType(), want.MessageVersion()
		m, err := domain.DecodeMessage(typ, version, body)
		if err != nil {
			if !errors.Is(err, domain.ErrMalformedMessage) || !strings.Contains(err.Error(), typ) {
				t.Fatalf("%s v%d %q: %v, want an ErrMalformedMessage naming the type", typ, version, body, err)
			}
			return
		}
		if !json.Valid(body) {
			t.Fatalf("%s v%d: accepted %q, which is not one JSON value", typ, version, body)
		}
		if m.MessageType() != typ || m.MessageVersion() != version || reflect.TypeOf(m) != reflect.TypeOf(want) {
			t.Fatalf("%s v%d %q decodes to a %T (%s v%d)", typ, version, body, m, m.MessageType(), m.MessageVersion())
		}
		if m.OrderID() == uuid.Nil {
			t.Fatalf("%s v%d %q: accepted without an order_id", typ, version, body)
		}
		again, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		back, err := domain.DecodeMessage(typ, version, again)
		if err != nil {
			t.Fatalf("%s v%d %q decodes to %+v; re-encoded, %s does not decode: %v", typ, version, body, m, again, err)
		}
		if twice, _ := json.Marshal(back); string(twice) != string(again) {
			t.Fatalf("%s v%d %q: re-encoded %s, then %s", typ, version, body, again, twice)
		}
	})
}
