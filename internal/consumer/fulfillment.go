package consumer

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/yourorg/orders/internal/domain"
	"github.com/yourorg/orders/internal/messaging"
	"github.com/yourorg/orders/internal/store"
)

// Fulfillment drives an order through fulfillment: it asks the warehouse to
// reserve the stock of a submitted order, and finishes the order on the
// warehouse's answer.
func Fulfillment() messaging.ConsumerSpec {
	return messaging.ConsumerSpec{
		Name:    NameFulfillment,
		Types:   []string{domain.TypeOrderSubmitted, domain.TypeFulfillmentCompleted, domain.TypeFulfillmentRejected},
		Handler: messaging.HandlerFunc(handleFulfillment),
	}
}

func handleFulfillment(ctx context.Context, tx pgx.Tx, d *messaging.Delivery) (messaging.Outcome, error) {
	switch m := d.Message.(type) {
	case domain.OrderSubmittedV1:
		// The request carries the lines of the submitted order: its payload
		// is the order as it was accepted, and lines never change.
		return transition(ctx, tx, d, domain.TriggerSubmitted, domain.FulfillmentRequestedV1{ID: m.ID, Items: m.Items})
	case domain.FulfillmentCompletedV1:
		return transition(ctx, tx, d, domain.TriggerFulfillmentCompleted, domain.OrderFulfilledV1{ID: m.ID})
	case domain.FulfillmentRejectedV1:
		return transition(ctx, tx, d, domain.TriggerFulfillmentRejected, domain.OrderRejectedV1{ID: m.ID, Reason: m.Reason})
	}
	return messaging.Outcome{}, messaging.Permanent("unexpected_type", fmt.Errorf("fulfillment does not handle %s", d.Type))
}

// transition moves the order of d by trigger (one guarded statement that
// also records the move with d's message_id) and emits followUp. A message
// that finds the order past it is acknowledged and ignored; one the order
// is not ready for, or about an order that does not exist, is parked: no
// message is published before its order commits, so waiting would not help.
func transition(ctx context.Context, tx pgx.Tx, d *messaging.Delivery, trigger domain.Trigger, followUp domain.Message) (messaging.Outcome, error) {
	id := d.Message.OrderID()
	_, current, err := store.MoveOrder(ctx, tx, id, trigger, store.Cause{MessageID: d.MessageID, CorrelationID: d.CorrelationID})
	switch {
	case err == nil:
		return messaging.Applied(followUp), nil
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
