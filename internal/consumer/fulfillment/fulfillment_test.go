package fulfillment_test

import (
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	metricnoop "go.opentelemetry.io/otel/metric/noop"

	"github.com/yourorg/orders/internal/consumer/fulfillment"
	"github.com/yourorg/orders/internal/domain"
	"github.com/yourorg/orders/internal/messaging/inbox"
	"github.com/yourorg/orders/internal/messaging/inbox/inboxtest"
	"github.com/yourorg/orders/internal/store"
)

// An order moves SUBMITTED -> FULFILLMENT_REQUESTED -> FULFILLED on its
// messages, each move recorded in its history with the message that made
// it; a message the order is not ready for is parked as an invalid
// transition, and one about an order that does not exist as not found.
func TestMovesTheOrder(t *testing.T) {
	t.Parallel()
	h := inboxtest.Start(t, fulfillment.New(metricnoop.NewMeterProvider()))
	o, err := domain.NewOrder(uuid.Must(uuid.NewV7()), "c-1", "EUR", []domain.Item{{SKU: "A-1", Quantity: 1, UnitPriceCents: 100}})
	if err != nil {
		t.Fatal(err)
	}
	err = pgx.BeginFunc(h.Ctx, h.Pool, func(tx pgx.Tx) error {
		_, err := store.CreateOrder(h.Ctx, tx, o, domain.Cause{CorrelationID: "c"})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	status := func() domain.Status {
		got, err := store.GetOrder(h.Ctx, h.Pool, o.ID())
		if err != nil {
			t.Fatal(err)
		}
		return got.Status()
	}

	early := h.Deliver(domain.FulfillmentCompletedV1{ID: o.ID()})
	if row := h.WaitDone(fulfillment.Name, early); row.Status != inbox.StatusPermanentFailed || row.LastErrorCode != "invalid_transition" {
		t.Fatalf("completed before requested: %+v, want PERMANENT_FAILED invalid_transition", row)
	}

	submitted := h.Deliver(domain.SubmittedMessage(o))
	h.WaitDone(fulfillment.Name, submitted)
	if got := status(); got != domain.StatusFulfillmentRequested {
		t.Fatalf("status %s after order.submitted", got)
	}
	completed := h.Deliver(domain.FulfillmentCompletedV1{ID: o.ID()})
	h.WaitDone(fulfillment.Name, completed)
	if got := status(); got != domain.StatusFulfilled {
		t.Fatalf("status %s after fulfillment.completed", got)
	}
	history, err := store.History(h.Ctx, h.Pool, o.ID())
	if err != nil || len(history) != 3 || history[1].MessageID == nil || *history[1].MessageID != submitted ||
		history[2].MessageID == nil || *history[2].MessageID != completed {
		t.Fatalf("history %+v (%v): want creation, then the two moves with their message ids", history, err)
	}

	missing := h.Deliver(domain.OrderSubmittedV1{ID: uuid.New()})
	if row := h.WaitDone(fulfillment.Name, missing); row.LastErrorCode != "order_not_found" {
		t.Fatalf("an order that does not exist: %+v, want order_not_found", row)
	}
}
