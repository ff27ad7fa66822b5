package consumer

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/yourorg/orders/internal/domain"
	"github.com/yourorg/orders/internal/messaging"
	"github.com/yourorg/orders/internal/store"
)

// OutOfStockPrefix marks the skus the warehouse never has.
const OutOfStockPrefix = "OOS-"

// Reservation statuses.
const (
	reserved = "RESERVED"
	rejected = "REJECTED"
	released = "RELEASED"
)

// Warehouse stands in for a downstream system: it reserves the stock of a
// fulfillment request and answers, and releases the reservation of a
// cancelled order. One reservation per order is its own business
// idempotency, next to the inbox's message idempotency.
func Warehouse() messaging.ConsumerSpec {
	return messaging.ConsumerSpec{
		Name:    NameWarehouse,
		Types:   []string{domain.TypeFulfillmentRequested, domain.TypeOrderCancelled},
		Handler: messaging.HandlerFunc(handleWarehouse),
	}
}

func handleWarehouse(ctx context.Context, tx pgx.Tx, d *messaging.Delivery) (messaging.Outcome, error) {
	switch m := d.Message.(type) {
	case domain.FulfillmentRequestedV1:
		return reserve(ctx, tx, d, m)
	case domain.OrderCancelledV1:
		return release(ctx, tx, d, m)
	}
	return messaging.Outcome{}, messaging.Permanent("unexpected_type", fmt.Errorf("warehouse does not handle %s", d.Type))
}

func reserve(ctx context.Context, tx pgx.Tx, d *messaging.Delivery, m domain.FulfillmentRequestedV1) (messaging.Outcome, error) {
	r := store.Reservation{OrderID: m.ID, ReservationID: uuid.Must(uuid.NewV7()), Status: reserved, MessageID: d.MessageID}
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
	created, err := store.CreateReservation(ctx, tx, r)
	if err != nil {
		return messaging.Outcome{}, err
	}
	if !created {
		existing, err := store.LockReservation(ctx, tx, m.ID)
		if err != nil {
			return messaging.Outcome{}, err
		}
		if existing.Status == released {
			return messaging.Ignore("the order was cancelled before its fulfillment request arrived"), nil
		}
		return messaging.Ignore(fmt.Sprintf("the order already has a reservation (%s)", existing.Status)), nil
	}
	return messaging.Applied(answer), nil
}

func release(ctx context.Context, tx pgx.Tx, d *messaging.Delivery, m domain.OrderCancelledV1) (messaging.Outcome, error) {
	existing, err := store.LockReservation(ctx, tx, m.ID)
	if errors.Is(err, domain.ErrNotFound) {
		// Cancelled before any request reached us (or before the order was
		// ever sent for fulfillment): remember it, so that a late request is
		// not reserved.
		created, err := store.CreateReservation(ctx, tx, store.Reservation{
			OrderID: m.ID, ReservationID: uuid.Must(uuid.NewV7()), Status: released,
			Reason: "cancelled before any fulfillment request", MessageID: d.MessageID,
		})
		if err != nil || created {
			return messaging.Applied(), err
		}
		// A request won the race to insert: release what it reserved.
		if existing, err = store.LockReservation(ctx, tx, m.ID); err != nil {
			return messaging.Outcome{}, err
		}
	} else if err != nil {
		return messaging.Outcome{}, err
	}
	switch existing.Status {
	case reserved:
		return messaging.Applied(), store.ReleaseReservation(ctx, tx, m.ID)
	case rejected:
		return messaging.Ignore("nothing was reserved: the request was rejected"), nil
	default:
		return messaging.Ignore("the reservation is released already"), nil
	}
}
