package consumer

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/yourorg/orders/internal/domain"
	"github.com/yourorg/orders/internal/messaging"
	"github.com/yourorg/orders/internal/store"
)

// Fulfillment drives an order through fulfillment: it asks the warehouse to
// reserve the stock of a submitted order, and finishes the order on the
// warehouse's answer. It reports how long orders take from their creation
// to FULFILLED or REJECTED (orders.completion.duration) through mp.
func Fulfillment(mp metric.MeterProvider) (messaging.ConsumerSpec, error) {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	completion, err := mp.Meter("github.com/yourorg/orders/internal/consumer").Float64Histogram("orders.completion.duration",
		metric.WithUnit("s"), metric.WithDescription("From an order's creation to its final status (FULFILLED or REJECTED), by status."),
		metric.WithExplicitBucketBoundaries(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300))
	if err != nil {
		return messaging.ConsumerSpec{}, err
	}
	f := &fulfillment{completion: completion}
	return messaging.ConsumerSpec{
		Name:    NameFulfillment,
		Types:   []string{domain.TypeOrderSubmitted, domain.TypeFulfillmentCompleted, domain.TypeFulfillmentRejected},
		Handler: messaging.HandlerFunc(f.handle),
	}, nil
}

type fulfillment struct {
	completion metric.Float64Histogram
}

func (f *fulfillment) handle(ctx context.Context, tx pgx.Tx, d *messaging.Delivery) (messaging.Outcome, error) {
	switch m := d.Message.(type) {
	case domain.OrderSubmittedV1:
		// The request carries the lines of the submitted order: its payload
		// is the order as it was accepted, and lines never change.
		return f.transition(ctx, tx, d, domain.TriggerSubmitted, domain.FulfillmentRequestedV1{ID: m.ID, Items: m.Items})
	case domain.FulfillmentCompletedV1:
		return f.transition(ctx, tx, d, domain.TriggerFulfillmentCompleted, domain.OrderFulfilledV1{ID: m.ID})
	case domain.FulfillmentRejectedV1:
		return f.transition(ctx, tx, d, domain.TriggerFulfillmentRejected, domain.OrderRejectedV1{ID: m.ID, Reason: m.Reason})
	}
	return messaging.Outcome{}, messaging.Permanent("unexpected_type", fmt.Errorf("fulfillment does not handle %s", d.Type))
}

// transition moves the order of d by trigger (one guarded statement that
// also records the move with d's message_id) and emits followUp. A message
// that finds the order past it is acknowledged and ignored; one the order
// is not ready for, or about an order that does not exist, is parked: no
// message is published before its order commits, so waiting would not help.
func (f *fulfillment) transition(ctx context.Context, tx pgx.Tx, d *messaging.Delivery, trigger domain.Trigger, followUp domain.Message) (messaging.Outcome, error) {
	id := d.Message.OrderID()
	move, current, err := store.MoveOrder(ctx, tx, id, trigger, store.Cause{MessageID: d.MessageID, CorrelationID: d.CorrelationID})
	switch {
	case err == nil:
		out := messaging.Applied(followUp)
		if move.To.Final() {
			out.AfterCommit = func(ctx context.Context) {
				f.completion.Record(ctx, move.UpdatedAt.Sub(move.CreatedAt).Seconds(), metric.WithAttributes(attribute.String("status", string(move.To))))
			}
		}
		return out, nil
	case errors.Is(err, domain.ErrNotFound):
		return messaging.Outcome{}, messaging.Permanent("order_not_found", fmt.Errorf("order %s does not exist", id))
	case errors.Is(err, domain.ErrStaleTransition):
		again, err := store.TransitionRecorded(ctx, tx, id, d.MessageID)
		if err != nil {
			return messaging.Outcome{}, err
		}
		if again {
			return messaging.Ignore("this message already moved the order"), nil
		}
		return messaging.Ignore(fmt.Sprintf("the order is %s, past %s", current, trigger)), nil
	case errors.Is(err, domain.ErrInvalidTransition):
		return messaging.Outcome{}, messaging.Permanent("invalid_transition",
			fmt.Errorf("order %s is %s: %s cannot apply to it", id, current, trigger))
	}
	return messaging.Outcome{}, err
}
