// Package shipping is the last step of an order's flow: every fulfilled
// order gets one shipment, ready for the carrier (its table, shipment),
// with the warehouse's reservation to pick it from. It reads
// order.fulfilled and emits nothing.
//
// It was added through the recipe of docs/extending.md: this folder, one
// migration (00006_shipment.sql) and one line in internal/consumer.All.
// It reads both versions of order.fulfilled, as the recipe for evolving a
// message has it: version 2 names the reservation (00013_shipment_reservation.sql
// keeps it); version 1, which fulfillment writes until
// ORDER_FULFILLED_VERSION=2, and which may wait in a queue or a parking
// lot long after, does not, and its shipment has none.
package shipping

import (
	"context"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/yourorg/orders/internal/domain"
	"github.com/yourorg/orders/internal/messaging/inbox"
	"github.com/yourorg/orders/internal/store"
)

// Name is the consumer's name: its consumer_name in the inbox and the
// name of its queues.
const Name = "shipping"

// StatusReadyToShip is the status of a new shipment.
const StatusReadyToShip = "READY_TO_SHIP"

// New returns the consumer.
func New() *inbox.Consumer {
	c := inbox.NewConsumer(Name)
	inbox.Handle(c, func(ctx context.Context, tx pgx.Tx, d *inbox.Delivery, m domain.OrderFulfilledV1) (inbox.Outcome, error) {
		return ship(ctx, tx, d, m.ID, nil) // version 1 names no reservation
	})
	inbox.Handle(c, func(ctx context.Context, tx pgx.Tx, d *inbox.Delivery, m domain.OrderFulfilledV2) (inbox.Outcome, error) {
		return ship(ctx, tx, d, m.ID, &m.ReservationID)
	})
	return c
}

// ship creates the shipment of a fulfilled order, with its stock
// reservation when the message names it, unless the order has one.
func ship(ctx context.Context, tx pgx.Tx, d *inbox.Delivery, orderID uuid.UUID, reservationID *uuid.UUID) (inbox.Outcome, error) {
	tag, err := tx.Exec(ctx, `
		INSERT INTO shipment (shipment_id, order_id, status, message_id, reservation_id)
		VALUES ($1, $2, $3, $4, $5)
		ON CONFLICT (order_id) DO NOTHING`,
		uuid.Must(uuid.NewV7()), orderID, StatusReadyToShip, d.MessageID, reservationID)
	if err != nil {
		return inbox.Outcome{}, fmt.Errorf("insert shipment of order %s: %w", orderID, store.Translate(err))
	}
	if tag.RowsAffected() == 0 {
		return inbox.Ignore("the order has a shipment already"), nil
	}
	return inbox.Applied(), nil
}
