package inbox_test

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/yourorg/orders/internal/messaging/inbox"
)

// shipped is a message of some service: a parcel left the warehouse.
type shipped struct {
	ParcelID string `json:"parcel_id"`
}

func (shipped) MessageType() string   { return "parcel.shipped" }
func (shipped) MessageVersion() int   { return 1 }
func (m shipped) AggregateID() string { return m.ParcelID }

// A consumer is a name and a typed handler per message type it reads; its
// queue is bound to exactly those types.
func ExampleHandle() {
	c := inbox.NewConsumer("tracking")
	inbox.Handle(c, func(ctx context.Context, tx pgx.Tx, d *inbox.Delivery, m shipped) (inbox.Outcome, error) {
		// Change the database in tx only, and say what you did.
		return inbox.Applied(), nil
	})
	fmt.Println(c.Name(), c.Types())
	// Output: tracking [parcel.shipped]
}
