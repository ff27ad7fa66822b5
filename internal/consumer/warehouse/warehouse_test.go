package warehouse_test

import (
	"testing"

	"github.com/google/uuid"

	"github.com/yourorg/orders/internal/consumer/consumertest"
	"github.com/yourorg/orders/internal/consumer/warehouse"
	"github.com/yourorg/orders/internal/domain"
	"github.com/yourorg/orders/internal/messaging/inbox"
)

// reservation reads the status of an order's reservation.
func reservation(t *testing.T, h *consumertest.Harness, order uuid.UUID) string {
	t.Helper()
	var status string
	if err := h.Pool.QueryRow(h.Ctx, "SELECT status FROM stock_reservation WHERE order_id = $1", order).Scan(&status); err != nil {
		t.Fatal(err)
	}
	return status
}

// answer reads the type of the message the warehouse wrote to the outbox
// in answer to message id (its causation_id).
func answer(t *testing.T, h *consumertest.Harness, id string) string {
	t.Helper()
	var typ string
	if err := h.Pool.QueryRow(h.Ctx, "SELECT message_type FROM message_outbox WHERE headers->>'causation_id' = $1", id).Scan(&typ); err != nil {
		t.Fatal(err)
	}
	return typ
}

// A request is reserved and answered fulfillment.completed, in the
// transaction of its inbox row; a cancellation releases the reservation.
// A request with an out-of-stock line is rejected, and answered so.
func TestReserveAnswerAndRelease(t *testing.T) {
	t.Parallel()
	h := consumertest.Start(t, warehouse.New())
	inStock, outOfStock := uuid.New(), uuid.New()

	req := h.Deliver(domain.FulfillmentRequestedV1{ID: inStock, Items: []domain.ItemLine{{SKU: "A-1", Quantity: 1}}})
	h.WaitDone(warehouse.Name, req)
	if got := reservation(t, h, inStock); got != "RESERVED" {
		t.Fatalf("reservation %s, want RESERVED", got)
	}
	if got := answer(t, h, req); got != domain.TypeFulfillmentCompleted {
		t.Fatalf("answered %s, want %s", got, domain.TypeFulfillmentCompleted)
	}

	cancel := h.Deliver(domain.OrderCancelledV1{ID: inStock})
	if row := h.WaitDone(warehouse.Name, cancel); row.Outcome != inbox.OutcomeApplied {
		t.Fatalf("cancellation: %+v", row)
	}
	if got := reservation(t, h, inStock); got != "RELEASED" {
		t.Fatalf("reservation %s after the cancellation, want RELEASED", got)
	}

	oos := h.Deliver(domain.FulfillmentRequestedV1{ID: outOfStock, Items: []domain.ItemLine{{SKU: warehouse.OutOfStockPrefix + "9", Quantity: 1}}})
	h.WaitDone(warehouse.Name, oos)
	if got := reservation(t, h, outOfStock); got != "REJECTED" {
		t.Fatalf("reservation %s, want REJECTED", got)
	}
	if got := answer(t, h, oos); got != domain.TypeFulfillmentRejected {
		t.Fatalf("answered %s, want %s", got, domain.TypeFulfillmentRejected)
	}
}

// A cancellation that arrives before the request leaves a RELEASED
// reservation, so that the late request reserves nothing and answers
// nothing.
func TestCancelBeforeRequest(t *testing.T) {
	t.Parallel()
	h := consumertest.Start(t, warehouse.New())
	order := uuid.New()
	h.WaitDone(warehouse.Name, h.Deliver(domain.OrderCancelledV1{ID: order}))
	req := h.Deliver(domain.FulfillmentRequestedV1{ID: order, Items: []domain.ItemLine{{SKU: "A-1", Quantity: 1}}})
	if row := h.WaitDone(warehouse.Name, req); row.Outcome != inbox.OutcomeIgnored {
		t.Fatalf("the late request: %+v, want IGNORED", row)
	}
	if got := reservation(t, h, order); got != "RELEASED" {
		t.Fatalf("reservation %s, want RELEASED", got)
	}
	if n := h.Count("SELECT count(*) FROM message_outbox"); n != 0 {
		t.Fatalf("%d answers to a cancelled order's request, want none", n)
	}
}
