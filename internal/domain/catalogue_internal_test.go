package domain

import (
	"reflect"
	"testing"
)

// Each entry of the catalogue is filed under its example's own type and
// version, and decodes into the example's Go type.
func TestCatalogueEntriesMatchTheirKeys(t *testing.T) {
	t.Parallel()
	for k, e := range catalogue {
		if e.example.MessageType() != k.typ || e.example.MessageVersion() != k.version {
			t.Errorf("catalogue[%s v%d] holds an example of %s v%d", k.typ, k.version, e.example.MessageType(), e.example.MessageVersion())
		}
		got, err := e.decode([]byte(`{"order_id":"0193a3c4-2f6e-7d1a-9b3c-4d5e6f708190"}`))
		if err != nil || reflect.TypeOf(got) != reflect.TypeOf(e.example) {
			t.Errorf("catalogue[%s v%d] decodes into %T (%v), want %T", k.typ, k.version, got, err, e.example)
		}
	}
}
