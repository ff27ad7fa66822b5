// Package warehouse stands in for a downstream system: it reserves the
// stock of a fulfillment request and answers fulfillment.completed, or
// fulfillment.rejected when a sku starts with "OOS-" (out of stock); on
// order.cancelled it releases the reservation. One reservation per order
// (its table, stock_reservation) is its own business idempotency, next to
// the inbox's message idempotency.
package warehouse

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/yourorg/orders/internal/domain"
	"github.com/yourorg/orders/internal/messaging/inbox"
)

// OutOfStockPrefix marks the skus the warehouse never has.
const OutOfStockPrefix = "OOS-"

// Reservation statuses.
const (
	reserved = "RESERVED"
	rejected = "REJECTED"
	released = "RELEASED"
)

// Name is the consumer's name: its consumer_name in the inbox and the
// name of its queues.
const Name = "warehouse"

// New returns the consumer.
func New() *inbox.Consumer {
	c := inbox.NewConsumer(Name)
	inbox.Handle(c, reserve)
	inbox.Handle(c, release)
	return c
}

// reserve reserves the stock of a fulfillment request and answers it.
func reserve(ctx context.Context, tx pgx.Tx, d *inbox.Delivery, m domain.FulfillmentRequestedV1) (inbox.Outcome, error) {
	r := reservation{OrderID: m.ID, ReservationID: uuid.Must(uuid.NewV7()), Status: reserved, MessageID: d.MessageID}
	var answer domain.Message = domain.FulfillmentCompletedV1{ID: m.ID, ReservationID: r.ReservationID}
	var missing []string
	for _, it := range m.Items {
		if strings.HasPrefix(it.SKU, OutOfStockPrefix) {
			missing = append(missing, it.SKU)
		}
	}
	if len(missing) > 0 {
		r.Status, r.Reason = rejected, "out of stock: "+strings.Join(missing, ", ")
		answer = domain.FulfillmentRejectedV1{ID: m.ID, Reason: "out of stock", SKUs: missing}
	}
	created, err := createReservation(ctx, tx, r)
	if err != nil {
		return inbox.Outcome{}, err
	}
	if !created {
		existing, err := lockReservation(ctx, tx, m.ID)
		if err != nil {
			return inbox.Outcome{}, err
		}
		if existing.Status == released {
			return inbox.Ignore("the order was cancelled before its fulfillment request arrived"), nil
		}
		return inbox.Ignore(fmt.Sprintf("the order already has a reservation (%s)", existing.Status)), nil
	}
	return inbox.Applied(answer), nil
}

// release releases the reservation of a cancelled order, or remembers the
// cancellation when no request has arrived yet.
func release(ctx context.Context, tx pgx.Tx, d *inbox.Delivery, m domain.OrderCancelledV1) (inbox.Outcome, error) {
	existing, err := lockReservation(ctx, tx, m.ID)
	if errors.Is(err, domain.ErrNotFound) {
		// Cancelled before any request reached us (or before the order was
		// ever sent for fulfillment): remember it, so that a late request is
		// not reserved.
		created, err := createReservation(ctx, tx, reservation{
			OrderID: m.ID, ReservationID: uuid.Must(uuid.NewV7()), Status: released,
			Reason: "cancelled before any fulfillment request", MessageID: d.MessageID,
		})
		if err != nil || created {
			return inbox.Applied(), err
		}
		// A request won the race to insert: release what it reserved.
		if existing, err = lockReservation(ctx, tx, m.ID); err != nil {
			return inbox.Outcome{}, err
		}
	} else if err != nil {
		return inbox.Outcome{}, err
	}
	switch existing.Status {
	case reserved:
		return inbox.Applied(), releaseReservation(ctx, tx, m.ID)
	case rejected:
		return inbox.Ignore("nothing was reserved: the request was rejected"), nil
	default:
		return inbox.Ignore("the reservation is released already"), nil
	}
}
