package fulfillment_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	metricnoop "go.opentelemetry.io/otel/metric/noop"

	"github.com/yourorg/orders/internal/consumer/consumertest"
	"github.com/yourorg/orders/internal/consumer/fulfillment"
	"github.com/yourorg/orders/internal/domain"
	"github.com/yourorg/orders/internal/messaging/inbox"
	"github.com/yourorg/orders/internal/store"
)

// An order moves SUBMITTED -> FULFILLMENT_REQUESTED -> FULFILLED on its
// messages, each move recorded in its history with the message that made
// it; a message the order is not ready for is parked as an invalid
// transition, and one about an order that does not exist as not found.
func TestMovesTheOrder(t *testing.T) {
	t.Parallel()
	h := consumertest.Start(t, fulfillment.New(fulfillment.Config{MeterProvider: metricnoop.NewMeterProvider()}))
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

	early := h.Deliver(domain.FulfillmentCompletedV1{ID: o.ID(), ReservationID: uuid.New()})
	if row := h.WaitDone(fulfillment.Name, early); row.Status != inbox.StatusPermanentFailed || row.LastErrorCode != "invalid_transition" {
		t.Fatalf("completed before requested: %+v, want PERMANENT_FAILED invalid_transition", row)
	}

	submitted := h.Deliver(domain.SubmittedMessage(o))
	h.WaitDone(fulfillment.Name, submitted)
	if got := status(); got != domain.StatusFulfillmentRequested {
		t.Fatalf("status %s after order.submitted", got)
	}
	completed := h.Deliver(domain.FulfillmentCompletedV1{ID: o.ID(), ReservationID: uuid.New()})
	h.WaitDone(fulfillment.Name, completed)
	if got := status(); got != domain.StatusFulfilled {
		t.Fatalf("status %s after fulfillment.completed", got)
	}
	history, err := store.History(h.Ctx, h.Pool, o.ID())
	if err != nil || len(history) != 3 || history[1].MessageID == nil || *history[1].MessageID != submitted ||
		history[2].MessageID == nil || *history[2].MessageID != completed {
		t.Fatalf("history %+v (%v): want creation, then the two moves with their message ids", history, err)
	}

	missing := h.Deliver(noSuchOrder())
	if row := h.WaitDone(fulfillment.Name, missing); row.LastErrorCode != "order_not_found" {
		t.Fatalf("an order that does not exist: %+v, want order_not_found", row)
	}
}

// A rejection records why in the order's history, with the REJECTED move
// and in its transaction: the warehouse's reason and every sku it names.
// The other moves record no reason.
func TestRejectionRecordsItsReason(t *testing.T) {
	t.Parallel()
	h := consumertest.Start(t, fulfillment.New(fulfillment.Config{MeterProvider: metricnoop.NewMeterProvider()}))
	o, err := domain.NewOrder(uuid.Must(uuid.NewV7()), "c-1", "EUR", []domain.Item{
		{SKU: "OOS-1", Quantity: 1, UnitPriceCents: 100}, {SKU: "A-1", Quantity: 1, UnitPriceCents: 100}, {SKU: "OOS-2", Quantity: 1, UnitPriceCents: 100}})
	if err != nil {
		t.Fatal(err)
	}
	if err := pgx.BeginFunc(h.Ctx, h.Pool, func(tx pgx.Tx) error {
		_, err := store.CreateOrder(h.Ctx, tx, o, domain.Cause{CorrelationID: "c"})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	h.WaitDone(fulfillment.Name, h.Deliver(domain.SubmittedMessage(o)))
	rejected := h.Deliver(domain.FulfillmentRejectedV1{ID: o.ID(), Reason: "out of stock", SKUs: []string{"OOS-1", "OOS-2"}})
	h.WaitDone(fulfillment.Name, rejected)

	history, err := store.History(h.Ctx, h.Pool, o.ID())
	if err != nil || len(history) != 3 {
		t.Fatalf("history %+v (%v): want creation, request, rejection", history, err)
	}
	last := history[2]
	if last.To != domain.StatusRejected || last.MessageID == nil || *last.MessageID != rejected || last.Reason != "out of stock: OOS-1, OOS-2" {
		t.Fatalf("the rejection's row %+v: want REJECTED by %s, reason %q", last, rejected, "out of stock: OOS-1, OOS-2")
	}
	for _, e := range history[:2] {
		if e.Reason != "" {
			t.Errorf("the move to %s has a reason %q: only a rejection records one", e.To, e.Reason)
		}
	}
}

// With a delay (FULFILLMENT_DELAY), fulfillment waits before it requests
// the fulfillment, in no transaction: a cancel made meanwhile goes through
// at once, and the late order.submitted then finds the order CANCELLED and
// changes nothing.
func TestDelayLeavesTimeToCancel(t *testing.T) {
	t.Parallel()
	const delay = 2 * time.Second
	h := consumertest.Start(t, fulfillment.New(fulfillment.Config{MeterProvider: metricnoop.NewMeterProvider(), Delay: delay}))
	o, err := domain.NewOrder(uuid.Must(uuid.NewV7()), "c-1", "EUR", []domain.Item{{SKU: "A-1", Quantity: 1, UnitPriceCents: 100}})
	if err != nil {
		t.Fatal(err)
	}
	if err := pgx.BeginFunc(h.Ctx, h.Pool, func(tx pgx.Tx) error {
		_, err := store.CreateOrder(h.Ctx, tx, o, domain.Cause{CorrelationID: "c"})
		return err
	}); err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	submitted := h.Deliver(domain.SubmittedMessage(o))
	time.Sleep(delay / 4) // the consumer has the delivery, and waits
	// The consumers' sessions hold no transaction while they wait.
	if n := h.Count(`SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND application_name = 'consumers-under-test' AND xact_start IS NOT NULL`); n != 0 {
		t.Fatalf("%d consumer sessions are in a transaction during the wait", n)
	}
	cancelCtx, cancel := context.WithTimeout(h.Ctx, time.Second)
	defer cancel()
	if _, _, err := store.MoveOrder(cancelCtx, h.Pool, o.ID(), domain.TriggerCancel, domain.Cause{CorrelationID: "by-hand"}); err != nil {
		t.Fatalf("cancel during the wait: %v", err)
	}

	row := h.WaitDone(fulfillment.Name, submitted)
	if took := time.Since(start); took < delay {
		t.Errorf("processed after %v, before the delay of %v", took, delay)
	}
	if row.Status != inbox.StatusProcessed || row.Outcome != inbox.OutcomeIgnored || !strings.Contains(row.OutcomeReason, "CANCELLED") {
		t.Fatalf("inbox row %+v, want PROCESSED, IGNORED because the order is CANCELLED", row)
	}
	if n := h.Count(`SELECT count(*) FROM message_outbox WHERE aggregate_id = $1 AND message_type = $2`,
		o.ID().String(), domain.TypeFulfillmentRequested); n != 0 {
		t.Fatalf("%d fulfillment.requested rows for a cancelled order", n)
	}
}

// noSuchOrder is an order.submitted, whole, about an order that does not
// exist.
func noSuchOrder() domain.OrderSubmittedV1 {
	return domain.OrderSubmittedV1{ID: uuid.New(), CustomerID: "c-1", Currency: "EUR", TotalCents: 100,
		Items: []domain.ItemLine{{SKU: "A-1", Quantity: 1, UnitPriceCents: 100}}}
}
