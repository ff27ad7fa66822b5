// Package fulfillment is the order's own consumer: it drives an order
// through fulfillment. It asks the warehouse to reserve the stock of a
// submitted order (order.submitted -> FULFILLMENT_REQUESTED, emits
// fulfillment.requested) and finishes the order on the warehouse's answer
// (fulfillment.completed / .rejected -> FULFILLED / REJECTED, emits
// order.fulfilled / .rejected). Every move is one guarded statement on the
// order (internal/store), recorded in its history with the message's id.
package fulfillment

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/yourorg/orders/internal/domain"
	"github.com/yourorg/orders/internal/messaging/inbox"
	"github.com/yourorg/orders/internal/store"
)

// Name is the consumer's name: its consumer_name in the inbox and the
// name of its queues.
const Name = "fulfillment"

// Config configures the consumer.
type Config struct {
	// MeterProvider receives how long orders take from their creation to
	// FULFILLED or REJECTED (orders.completion.duration). Default: the
	// global one.
	MeterProvider metric.MeterProvider
	// Delay is how long it waits after it receives an order.submitted and
	// before it requests the fulfillment, out of any transaction
	// (FULFILLMENT_DELAY, a demo knob: 0 in production), so that a cancel
	// can be shown by hand.
	Delay time.Duration
	// FulfilledVersion is the version of order.fulfilled it writes
	// (ORDER_FULFILLED_VERSION): 1, or 2 (with the reservation) once every
	// reader of order.fulfilled reads version 2 (docs/extending.md).
	// Default 1.
	FulfilledVersion int
}

// New returns the consumer. A FulfilledVersion the domain's catalogue
// does not have is a programming error: New panics, at start-up (the
// binaries check their setting first).
func New(cfg Config) *inbox.Consumer {
	mp := cfg.MeterProvider
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	fulfilledVersion := cmp.Or(cfg.FulfilledVersion, 1)
	if !slices.Contains(domain.MessageVersions(domain.TypeOrderFulfilled), fulfilledVersion) {
		panic(fmt.Sprintf("fulfillment: order.fulfilled has no version %d", fulfilledVersion))
	}
	completion, err := mp.Meter("github.com/yourorg/orders/internal/consumer/fulfillment").Float64Histogram("orders.completion.duration",
		metric.WithUnit("s"), metric.WithDescription("From an order's creation to its final status (FULFILLED or REJECTED), by status."),
		metric.WithExplicitBucketBoundaries(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300))
	if err != nil {
		otel.Handle(err) // the instrument still works; only its export may not
	}
	f := &fulfillment{completion: completion, fulfilledVersion: fulfilledVersion}
	c := inbox.NewConsumer(Name)
	inbox.Handle(c, f.submitted)
	inbox.Wait[domain.OrderSubmittedV1](c, cfg.Delay)
	inbox.Handle(c, f.completed)
	inbox.Handle(c, f.rejected)
	return c
}

type fulfillment struct {
	completion       metric.Float64Histogram
	fulfilledVersion int // of the order.fulfilled it writes
}

// submitted asks the warehouse for the stock of a new order. The request
// carries the lines of the submitted order: its payload is the order as it
// was accepted, and lines never change.
func (f *fulfillment) submitted(ctx context.Context, tx pgx.Tx, d *inbox.Delivery, m domain.OrderSubmittedV1) (inbox.Outcome, error) {
	return f.transition(ctx, tx, d, m.ID, domain.TriggerSubmitted, "", domain.FulfillmentRequestedV1{ID: m.ID, Items: m.Items})
}

// completed finishes an order the warehouse reserved, and says so in the
// version of order.fulfilled its readers are ready for: version 2 passes
// the reservation on to shipping.
func (f *fulfillment) completed(ctx context.Context, tx pgx.Tx, d *inbox.Delivery, m domain.FulfillmentCompletedV1) (inbox.Outcome, error) {
	var fulfilled domain.Message = domain.OrderFulfilledV1{ID: m.ID}
	if f.fulfilledVersion == 2 {
		// Field by field, not a conversion: two messages that happen to
		// have the same fields today are not the same message.
		fulfilled = domain.OrderFulfilledV2{ID: m.ID, ReservationID: m.ReservationID} //nolint:staticcheck // S1016, as above
	}
	return f.transition(ctx, tx, d, m.ID, domain.TriggerFulfillmentCompleted, "", fulfilled)
}

// rejected finishes an order the warehouse could not reserve, and records
// why with the move: the warehouse's reason and the skus it names ("out of
// stock: OOS-1"), which the API's history, the timeline and orderctl show.
func (f *fulfillment) rejected(ctx context.Context, tx pgx.Tx, d *inbox.Delivery, m domain.FulfillmentRejectedV1) (inbox.Outcome, error) {
	reason := m.Reason
	if len(m.SKUs) > 0 {
		reason += ": " + strings.Join(m.SKUs, ", ")
	}
	return f.transition(ctx, tx, d, m.ID, domain.TriggerFulfillmentRejected, reason, domain.OrderRejectedV1{ID: m.ID, Reason: m.Reason})
}

// transition moves order id by trigger (one guarded statement that
// also records the move with d's message_id and reason, "" for none) and
// emits followUp. A message
// that finds the order past it is acknowledged and ignored; one the order
// is not ready for, or about an order that does not exist, is parked: no
// message is published before its order commits, so waiting would not help.
func (f *fulfillment) transition(ctx context.Context, tx pgx.Tx, d *inbox.Delivery, id uuid.UUID, trigger domain.Trigger, reason string, followUp domain.Message) (inbox.Outcome, error) {
	move, current, err := store.MoveOrderBecause(ctx, tx, id, trigger, domain.Cause(d.Cause()), reason)
	switch {
	case err == nil:
		out := inbox.Applied(followUp)
		if move.To.Final() {
			out.AfterCommit = func(ctx context.Context) {
				f.completion.Record(ctx, move.UpdatedAt.Sub(move.CreatedAt).Seconds(), metric.WithAttributes(attribute.String("status", string(move.To))))
			}
		}
		return out, nil
	case errors.Is(err, domain.ErrNotFound):
		return inbox.Outcome{}, inbox.Permanent("order_not_found", fmt.Errorf("order %s does not exist", id))
	case errors.Is(err, domain.ErrStaleTransition):
		again, err := store.TransitionRecorded(ctx, tx, id, d.MessageID)
		if err != nil {
			return inbox.Outcome{}, err
		}
		if again {
			return inbox.Ignore("this message already moved the order"), nil
		}
		return inbox.Ignore(fmt.Sprintf("the order is %s, past %s", current, trigger)), nil
	case errors.Is(err, domain.ErrInvalidTransition):
		return inbox.Outcome{}, inbox.Permanent("invalid_transition",
			fmt.Errorf("order %s is %s: %s cannot apply to it", id, current, trigger))
	}
	return inbox.Outcome{}, err
}
