package outbox_test

import "github.com/google/uuid"

// The messages of these tests. The outbox publishes whatever a Writer
// wrote; these stand for the messages of any service.
const (
	testExchange  = "test.events"
	typeSubmitted = "test.submitted"
	typeCancelled = "test.cancelled"
	typeFulfilled = "test.fulfilled"
	typeRejected  = "test.rejected"
)

// testMessage is a message of any of the types above.
type testMessage struct {
	Type  string    `json:"-"`
	ID    uuid.UUID `json:"id"`
	Lines []line    `json:"lines,omitempty"`
}

type line struct {
	SKU            string `json:"sku"`
	Quantity       int    `json:"quantity"`
	UnitPriceCents int64  `json:"unit_price_cents"`
}

func (m testMessage) MessageType() string { return m.Type }
func (m testMessage) MessageVersion() int { return 1 }
func (m testMessage) AggregateID() string { return m.ID.String() }
