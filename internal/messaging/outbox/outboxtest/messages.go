package outboxtest

import "github.com/google/uuid"

// The messages of these tests. The outbox publishes whatever a Writer
// wrote; these stand for the messages of any service.
const (
	Exchange      = "test.events"
	TypeSubmitted = "test.submitted"
	TypeCancelled = "test.cancelled"
	TypeFulfilled = "test.fulfilled"
	TypeRejected  = "test.rejected"
)

// testMessage is a message of any of the types above.
type Message struct {
	Type  string    `json:"-"`
	ID    uuid.UUID `json:"id"`
	Lines []line    `json:"lines,omitempty"`
}

type line struct {
	SKU            string `json:"sku"`
	Quantity       int    `json:"quantity"`
	UnitPriceCents int64  `json:"unit_price_cents"`
}

func (m Message) MessageType() string { return m.Type }
func (m Message) MessageVersion() int { return 1 }
func (m Message) AggregateID() string { return m.ID.String() }
