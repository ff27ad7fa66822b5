package store_test

import (
	"context"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/yourorg/orders/internal/domain"
	"github.com/yourorg/orders/internal/messaging"
	"github.com/yourorg/orders/internal/store"
)

// An order and the message announcing it commit in one transaction, or
// neither does: the heart of the outbox. The example compiles with the
// package, so the package documentation that quotes it cannot go stale.
func ExampleCreateOrder() {
	ctx := context.Background()
	var pool *pgxpool.Pool // from database.NewPool
	writer := store.OutboxWriter("order-api")
	order, err := domain.NewOrder(uuid.Must(uuid.NewV7()), "c-1", "EUR", []domain.Item{{SKU: "A-1", Quantity: 2, UnitPriceCents: 1250}})
	if err != nil {
		return // a broken rule: 422
	}
	if pool == nil {
		return // the example shows the shape; it has no server to run on
	}
	cause := domain.Cause{CorrelationID: "req-1"}
	_ = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		created, err := store.CreateOrder(ctx, tx, order, cause)
		if err != nil {
			return err
		}
		_, err = writer.Write(ctx, tx, messaging.Cause(cause), domain.SubmittedMessage(created))
		return err
	})
}
