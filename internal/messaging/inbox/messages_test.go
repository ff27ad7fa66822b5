package inbox_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"

	"github.com/google/uuid"
)

// The messages of these tests. The inbox reads whatever its handlers
// declare; these stand for the messages of any service.
const (
	testExchange  = "test.events"
	typeCancelled = "test.cancelled"
	typeFulfilled = "test.fulfilled"
)

// cancelledV1 is what the test consumer reads.
type cancelledV1 struct {
	ID uuid.UUID `json:"id"`
}

// fulfilledV1 is the follow-up it writes.
type fulfilledV1 struct {
	ID uuid.UUID `json:"id"`
}

func (cancelledV1) MessageType() string   { return typeCancelled }
func (cancelledV1) MessageVersion() int   { return 1 }
func (m cancelledV1) AggregateID() string { return m.ID.String() }

// Validate refuses a body without an id: the inbox parks it as malformed.
func (m cancelledV1) Validate() error {
	if m.ID == uuid.Nil {
		return errors.New("id is missing")
	}
	return nil
}

func (fulfilledV1) MessageType() string   { return typeFulfilled }
func (fulfilledV1) MessageVersion() int   { return 1 }
func (m fulfilledV1) AggregateID() string { return m.ID.String() }

// canonicalUUID is a UUID as the schema of cancelledV1 wants it.
var canonicalUUID = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

// testSchema stands for a service's schema validator (inbox.Config.
// ValidateBody) over cancelledV1: it wants the id in its canonical form,
// which the decoder does not (uuid.UUID reads "urn:uuid:...", braces, and
// 32 bare hex digits too). What the decoder refuses anyway (a body that is
// not an object, a missing id) it leaves to the decoder. It has no schema
// for any other message: asked about one, it says so, and the message is
// parked as schema_violation, which the poison battery would see.
func testSchema(typ string, version int, body []byte) error {
	if typ != typeCancelled || version != 1 {
		return fmt.Errorf("no schema for %s version %d", typ, version)
	}
	var m map[string]any
	if json.Unmarshal(body, &m) != nil {
		return nil
	}
	if id, ok := m["id"].(string); ok && !canonicalUUID.MatchString(id) {
		return errors.New("at /id: not a UUID in canonical form")
	}
	return nil
}
