// Package fulfillment is the order's own consumer: it drives an order
// through fulfillment. It asks the warehouse to reserve the stock of a
// submitted order (order.submitted -> FULFILLMENT_REQUESTED, emits
// fulfillment.requested) and finishes the order on the warehouse's answer
// (fulfillment.completed / .rejected -> FULFILLED / REJECTED, emits
// order.fulfilled / .rejected). Every move is one guarded statement on the
// order (internal/store), recorded in its history with the message's id.
package fulfillment

import (
	"context"
	"errors"
	"fmt"
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

// New returns the consumer. It reports how long orders take from their
// creation to FULFILLED or REJECTED (orders.completion.duration) through
// mp (default: the global meter provider). It waits delay after it
// receives an order.submitted and before it requests the fulfillment, out
// of any transaction (FULFILLMENT_DELAY, a demo knob: 0 in production),
// so that a cancel can be shown by hand.
func New(mp metric.MeterProvider, delay time.Duration) *inbox.Consumer {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	completion, err := mp.Meter("github.com/yourorg/orders/internal/consumer/fulfillment").Float64Histogram("orders.completion.duration",
		metric.WithUnit("s"), metric.WithDescription("From an order's creation to its final status (FULFILLED or REJECTED), by status."),
		metric.WithExplicitBucketBoundaries(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300))
	if err != nil {
		otel.Handle(err) // the instrument still works; only its export may not
	}
	f := &fulfillment{completion: completion}
	c := inbox.NewConsumer(Name)
	inbox.Handle(c, f.submitted)
	inbox.Wait[domain.OrderSubmittedV1](c, delay)
	inbox.Handle(c, f.completed)
	inbox.Handle(c, f.rejected)
	return c
}

type fulfillment struct {
	completion metric.Float64Histogram
}

// submitted asks the warehouse for the stock of a new order. The request
// carries the lines of the submitted order: its payload is the order as it
// was accepted, and lines never change.
func (f *fulfillment) submitted(ctx context.Context, tx pgx.Tx, d *inbox.Delivery, m domain.OrderSubmittedV1) (inbox.Outcome, error) {
	return f.transition(ctx, tx, d, m.ID, domain.TriggerSubmitted, domain.FulfillmentRequestedV1{ID: m.ID, Items: m.Items})
}

// completed finishes an order the warehouse reserved.
func (f *fulfillment) completed(ctx context.Context, tx pgx.Tx, d *inbox.Delivery, m domain.FulfillmentCompletedV1) (inbox.Outcome, error) {
	return f.transition(ctx, tx, d, m.ID, domain.TriggerFulfillmentCompleted, domain.OrderFulfilledV1{ID: m.ID})
}

// rejected finishes an order the warehouse could not reserve.
func (f *fulfillment) rejected(ctx context.Context, tx pgx.Tx, d *inbox.Delivery, m domain.FulfillmentRejectedV1) (inbox.Outcome, error) {
	return f.transition(ctx, tx, d, m.ID, domain.TriggerFulfillmentRejected, domain.OrderRejectedV1{ID: m.ID, Reason: m.Reason})
}

// transition moves order id by trigger (one guarded statement that
// also records the move with d's message_id) and emits followUp. A message
// that finds the order past it is acknowledged and ignored; one the order
// is not ready for, or about an order that does not exist, is parked: no
// message is published before its order commits, so waiting would not help.
func (f *fulfillment) transition(ctx context.Context, tx pgx.Tx, d *inbox.Delivery, id uuid.UUID, trigger domain.Trigger, followUp domain.Message) (inbox.Outcome, error) {
	move, current, err := store.MoveOrder(ctx, tx, id, trigger, domain.Cause(d.Cause()))
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
