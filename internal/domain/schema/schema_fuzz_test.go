package schema_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/yourorg/orders/internal/domain"
	"github.com/yourorg/orders/internal/domain/schema"
)

// The schema validator on any body, for every (type, version) of the
// catalogue: entry picks the catalogue entry (domain.Examples, modulo their
// number). Validate never panics; a refusal is an ErrMalformedMessage
// that names the type and says where the payload breaks its schema; and
// what it accepts, domain.DecodeMessage decodes, but for the two things
// encoding/json reads otherwise than JSON Schema and which the decoder
// refuses (an integer spelled as a fraction, a key in another case), so
// that a consumer that checks the schema first meets no other refusal from
// its decoder. The
// seed corpus (testdata/fuzz/FuzzValidate) runs with every go test;
// `go test -fuzz FuzzValidate` explores from it.
func FuzzValidate(f *testing.F) {
	examples := domain.Examples()
	f.Fuzz(func(t *testing.T, entry uint8, body []byte) {
		m := examples[int(entry)%len(examples)]
		typ, version := m.MessageType(), m.MessageVersion()
		err := schema.Validate(typ, version, body)
		if err != nil {
			if !errors.Is(err, domain.ErrMalformedMessage) || !strings.Contains(err.Error(), typ) ||
				!strings.Contains(err.Error(), "at /") && !strings.Contains(err.Error(), "not one JSON value") {
				t.Fatalf("%s v%d %q: %v, want an ErrMalformedMessage that names the type and the place", typ, version, body, err)
			}
			return
		}
		if _, err := domain.DecodeMessage(typ, version, body); err != nil && !integerSpelledAsFraction(err) && !keyInOtherCase(err) {
			t.Fatalf("%s v%d %q matches its schema, yet DecodeMessage refuses it: %v", typ, version, body, err)
		}
	})
}

// keyInOtherCase reports whether err is DecodeMessage refusing a key that
// names a field only when case is ignored ("Order_Id" beside order_id):
// the schema lets it through as an unknown field, which a case-sensitive
// reader ignores, but encoding/json would read it into the field.
func keyInOtherCase(err error) bool {
	return strings.Contains(err.Error(), "field names are case-sensitive")
}

// integerSpelledAsFraction reports whether err is encoding/json refusing
// a number such as 2.0 or 2e0 for a Go integer: JSON Schema calls it an
// integer, and no schema can tell it from 2, so the decoder alone refuses
// it (as a malformed message, which is what it is for a Go reader).
func integerSpelledAsFraction(err error) bool {
	var typeErr *json.UnmarshalTypeError
	return errors.As(err, &typeErr) && strings.HasPrefix(typeErr.Value, "number ") && strings.ContainsAny(typeErr.Value, ".eE")
}
