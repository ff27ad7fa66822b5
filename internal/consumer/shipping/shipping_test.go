package shipping_test

import (
	"testing"

	"github.com/google/uuid"

	"github.com/yourorg/orders/internal/consumer/consumertest"
	"github.com/yourorg/orders/internal/consumer/shipping"
	"github.com/yourorg/orders/internal/domain"
	"github.com/yourorg/orders/internal/messaging/inbox"
)

// A fulfilled order gets one shipment, ready to ship: a redelivery of the
// same message is a duplicate, and another message about the same order
// (a second order.fulfilled, as a replay of an older copy would be) is
// ignored by the shipment's own key. Either way there is one shipment.
func TestOneShipmentPerFulfilledOrder(t *testing.T) {
	t.Parallel()
	h := consumertest.Start(t, shipping.New())
	order := uuid.New()
	shipments := func() int { return h.Count("SELECT count(*) FROM shipment WHERE order_id = $1", order) }

	first := h.Deliver(domain.OrderFulfilledV1{ID: order})
	if row := h.WaitDone(shipping.Name, first); row.Status != inbox.StatusProcessed || row.Outcome != inbox.OutcomeApplied {
		t.Fatalf("first delivery: inbox row %+v, want PROCESSED and APPLIED", row)
	}
	var status, messageID string
	if err := h.Pool.QueryRow(h.Ctx, "SELECT status, message_id FROM shipment WHERE order_id = $1", order).Scan(&status, &messageID); err != nil {
		t.Fatal(err)
	}
	if status != shipping.StatusReadyToShip || messageID != first {
		t.Fatalf("shipment: status %s, message %s; want %s, %s", status, messageID, shipping.StatusReadyToShip, first)
	}

	h.Redeliver(first)
	h.WaitDuplicates(1)

	second := h.Deliver(domain.OrderFulfilledV1{ID: order})
	if row := h.WaitDone(shipping.Name, second); row.Outcome != inbox.OutcomeIgnored || row.OutcomeReason == "" {
		t.Fatalf("another message about the same order: inbox row %+v, want IGNORED with a reason", row)
	}
	if n := shipments(); n != 1 {
		t.Fatalf("%d shipments for one order, want 1", n)
	}
}

// shipping reads order.fulfilled and nothing else: its queue is bound to
// that type alone.
func TestShippingReadsOrderFulfilled(t *testing.T) {
	t.Parallel()
	if got := shipping.New().Types(); len(got) != 1 || got[0] != domain.TypeOrderFulfilled {
		t.Fatalf("shipping reads %v, want [%s]", got, domain.TypeOrderFulfilled)
	}
}
