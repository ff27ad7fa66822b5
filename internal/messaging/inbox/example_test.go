package inbox_test

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/yourorg/orders/internal/domain"
	"github.com/yourorg/orders/internal/messaging/inbox"
)

// A consumer is a name and a typed handler per message type it reads; its
// queue is bound to exactly those types.
func ExampleHandle() {
	c := inbox.NewConsumer("shipping")
	inbox.Handle(c, func(ctx context.Context, tx pgx.Tx, d *inbox.Delivery, m domain.OrderFulfilledV1) (inbox.Outcome, error) {
		// Change the database in tx only, and say what you did.
		return inbox.Applied(), nil
	})
	fmt.Println(c.Name(), c.Types())
	// Output: shipping [order.fulfilled]
}
