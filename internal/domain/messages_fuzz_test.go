package domain_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
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
//
// The entry byte of a seed is an index into domain.Examples, which a new
// (type, version) shifts: so every example is a seed here too, whatever
// the files say, and TestFuzzSeedsNameTheirEntries keeps the files'
// example-* seeds on the entries they are named after.
func FuzzDecodeMessage(f *testing.F) {
	examples := domain.Examples()
	for i, m := range examples {
		body, err := json.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(uint8(i), body)
	}
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

// A seed file named example-<type> or example-<type>.v<version>, of this
// package's fuzz target or internal/domain/schema's, pairs its body with
// that entry of the catalogue.
func TestFuzzSeedsNameTheirEntries(t *testing.T) {
	t.Parallel()
	examples := domain.Examples()
	var files []string
	for _, dir := range []string{"testdata/fuzz/FuzzDecodeMessage", "schema/testdata/fuzz/FuzzValidate"} {
		found, err := filepath.Glob(dir + "/example-*")
		if err != nil || len(found) == 0 {
			t.Fatalf("%s: no example seeds (%v)", dir, err)
		}
		files = append(files, found...)
	}
	for _, file := range files {
		raw, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		var entry byte
		lines := strings.Split(string(raw), "\n")
		if len(lines) < 2 {
			t.Fatalf("%s: no entry byte", file)
		}
		if _, err := fmt.Sscanf(lines[1], `byte('\x%02x')`, &entry); err != nil {
			t.Fatalf("%s: entry %q: %v", file, lines[1], err)
		}
		m := examples[int(entry)%len(examples)]
		name := strings.TrimPrefix(filepath.Base(file), "example-")
		want := m.MessageType()
		if len(domain.MessageVersions(m.MessageType())) > 1 {
			want = fmt.Sprintf("%s.v%d", m.MessageType(), m.MessageVersion())
		}
		if name != want {
			t.Errorf("%s: its entry %d is %s version %d: renumber it (a new catalogue entry shifts those after it)",
				file, entry, m.MessageType(), m.MessageVersion())
		}
	}
}
