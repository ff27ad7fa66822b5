package inbox_test

import (
	"errors"

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
