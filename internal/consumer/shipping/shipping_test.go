package shipping_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/yourorg/orders/internal/consumer/consumertest"
	"github.com/yourorg/orders/internal/consumer/shipping"
	"github.com/yourorg/orders/internal/domain"
	"github.com/yourorg/orders/internal/messaging/inbox"
	"github.com/yourorg/orders/internal/messaging/inbox/inboxadmin"
	"github.com/yourorg/orders/internal/testenv"
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
	if got := shipping.New().Types(); !slices.Equal(got, []string{domain.TypeOrderFulfilled}) {
		t.Fatalf("shipping reads %v, want [%s]", got, domain.TypeOrderFulfilled)
	}
}

// reservationOf is the reservation_id of order's shipment: "" for none
// (NULL), "no shipment" when it has none.
func reservationOf(h *consumertest.Harness, order uuid.UUID) string {
	h.T.Helper()
	var id *uuid.UUID
	err := h.Pool.QueryRow(h.Ctx, "SELECT reservation_id FROM shipment WHERE order_id = $1", order).Scan(&id)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return "no shipment"
	case err != nil:
		h.T.Fatal(err)
	case id == nil:
		return ""
	}
	return id.String()
}

// shipping reads both versions of order.fulfilled while producers may
// write either: version 2 gives the shipment its reservation, version 1
// a shipment without one.
func TestReadsBothVersionsOfOrderFulfilled(t *testing.T) {
	t.Parallel()
	h := consumertest.Start(t, shipping.New())
	v1, v2, reservation := uuid.New(), uuid.New(), uuid.New()

	for _, id := range []string{h.Deliver(domain.OrderFulfilledV1{ID: v1}), h.Deliver(domain.OrderFulfilledV2{ID: v2, ReservationID: reservation})} {
		if row := h.WaitDone(shipping.Name, id); row.Status != inbox.StatusProcessed || row.Outcome != inbox.OutcomeApplied {
			t.Fatalf("inbox row %+v, want PROCESSED and APPLIED", row)
		}
	}
	if got := reservationOf(h, v1); got != "" {
		t.Errorf("the shipment of a version 1 message has reservation %q, want none", got)
	}
	if got := reservationOf(h, v2); got != reservation.String() {
		t.Errorf("the shipment of a version 2 message has reservation %q, want %s", got, reservation)
	}
}

// The upgrade, with a parking lot on either side of it. Before it, shipping
// reads order.fulfilled version 1 only (the build before version 2), and
// fails it too: a v1 it fails is parked, and so is a v2 it cannot read
// (unsupported_version: a producer switched to version 2 too early). The
// upgraded build (shipping.New: both versions) replays both from the
// parking lot, and both are PROCESSED: the v1 with no reservation, the v2
// with its own. This is why the version 1 handler stays until no version 1
// message can be replayed any more.
func TestParkedBeforeTheUpgradeReplaysAfterIt(t *testing.T) {
	t.Parallel()
	h := consumertest.Start(t)
	before := inbox.NewConsumer(shipping.Name)
	inbox.Handle(before, func(context.Context, pgx.Tx, *inbox.Delivery, domain.OrderFulfilledV1) (inbox.Outcome, error) {
		return inbox.Outcome{}, inbox.Permanent("carrier_unknown", errors.New("the build before the upgrade fails every shipment"))
	})
	old := h.Run(consumertest.Config(), h.DBURL, h.Metrics, before)

	v1, v2, reservation := uuid.New(), uuid.New(), uuid.New()
	parked := map[string]string{ // message id -> why the old build parks it
		h.Deliver(domain.OrderFulfilledV1{ID: v1}):                             "carrier_unknown",
		h.Deliver(domain.OrderFulfilledV2{ID: v2, ReservationID: reservation}): "unsupported_version",
	}
	for id, code := range parked {
		if row := h.WaitDone(shipping.Name, id); row.Status != inbox.StatusPermanentFailed || row.LastErrorCode != code {
			t.Fatalf("before the upgrade: inbox row %+v, want PERMANENT_FAILED %s", row, code)
		}
	}
	testenv.WaitFor(t, 15*time.Second, "both messages in the parking lot", func() bool {
		p, err := inboxadmin.Browse(h.Ctx, h.AMQPURL, shipping.Name, 0)
		if err != nil {
			t.Fatal(err)
		}
		return len(p) == len(parked)
	})
	old.Stop()

	h.Run(consumertest.Config(), h.DBURL, h.Metrics, shipping.New())
	moved, err := inboxadmin.Replay(h.Ctx, h.AMQPURL, shipping.Name, inboxadmin.ReplayRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(moved) != len(parked) {
		t.Fatalf("replayed %v, want the %d parked messages", moved, len(parked))
	}
	for _, id := range moved {
		if _, ok := parked[id]; !ok {
			t.Fatalf("replayed %s, which was not parked", id)
		}
		testenv.WaitFor(t, 15*time.Second, "the replayed "+id+" to be processed", func() bool {
			row, err := inboxadmin.Get(h.Ctx, h.Pool, shipping.Name, id)
			return err == nil && row.Status == inbox.StatusProcessed
		})
	}
	if got := reservationOf(h, v1); got != "" {
		t.Errorf("the replayed version 1 message: shipment reservation %q, want a shipment without one", got)
	}
	if got := reservationOf(h, v2); got != reservation.String() {
		t.Errorf("the replayed version 2 message: shipment reservation %q, want %s", got, reservation)
	}
	if p, err := inboxadmin.Browse(h.Ctx, h.AMQPURL, shipping.Name, 0); err != nil || len(p) != 0 {
		t.Fatalf("parking lot after the replay: %d messages (%v), want none", len(p), err)
	}
}
