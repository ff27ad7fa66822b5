package inboxadmin_test

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/yourorg/orders/internal/messaging/inbox"
	"github.com/yourorg/orders/internal/messaging/inbox/inboxadmin"
	"github.com/yourorg/orders/internal/testenv"
)

// A replay leaves parked the messages first delivered longer ago than the
// replay window, whose inbox rows retention may have dropped, and names
// the window; those within it are moved. The first delivery is the inbox
// row's, or without one, when the message was parked. --past-window
// (PastWindow) moves them too.
func TestReplayRefusesMessagesPastTheReplayWindow(t *testing.T) {
	t.Parallel()
	b := setupBroker(t)
	db := testenv.NewDatabase(t, inbox.Schema)
	topology := inbox.Topology{Consumer: testConsumer, Exchange: testExchange, Types: []string{typeCancelled},
		RetryDelays: []time.Duration{time.Second}, DeliveryLimit: 5}
	if err := topology.Declare(b.ch); err != nil {
		t.Fatal(err)
	}
	queue := inbox.QueueName(testConsumer)
	lot := inbox.ParkingLotName(queue)
	const window = 7 * 24 * time.Hour
	now := time.Now()
	// recent: first delivered an hour ago, parked since; old: first
	// delivered ten days ago, parked an hour ago; rowless: no inbox row,
	// parked eight days ago.
	var ids []string
	for _, first := range []time.Time{now.Add(-time.Hour), now.Add(-10 * 24 * time.Hour), {}} {
		msg := message()
		msg.Headers[inboxadmin.HeaderParkedCode] = "handler_error"
		msg.Headers[inboxadmin.HeaderParkedAt] = now.Add(-time.Hour).UTC().Format(time.RFC3339Nano)
		if first.IsZero() {
			msg.Headers[inboxadmin.HeaderParkedAt] = now.Add(-8 * 24 * time.Hour).UTC().Format(time.RFC3339Nano)
		} else if _, err := db.Pool.Exec(b.ctx, `
			INSERT INTO message_inbox (consumer_name, message_id, message_type, message_version, status, attempt_count,
			                           payload_hash, first_received_at, last_received_at, last_error_code)
			VALUES ($1, $2, $3, 1, 'POISONED', 3, 'hash', $4, $4, 'handler_error')`,
			testConsumer, msg.MessageId, typeCancelled, first); err != nil {
			t.Fatal(err)
		}
		b.publishTo("", lot, msg)
		ids = append(ids, msg.MessageId)
	}
	recent, old, rowless := ids[0], ids[1], ids[2]
	req := inboxadmin.ReplayRequest{Window: window, DB: db.Pool}

	// One message past the window: refused, left parked.
	one := req
	one.MessageID = old
	moved, err := inboxadmin.Replay(b.ctx, b.amqpURL, testConsumer, one)
	var past *inboxadmin.PastWindowError
	if len(moved) != 0 || !errors.As(err, &past) || !slices.Equal(past.IDs, []string{old}) ||
		!strings.Contains(err.Error(), "CONSUMER_REPLAY_WINDOW, 168h0m0s") {
		t.Fatalf("replay of a message first delivered 10 days ago: moved %v, %v", moved, err)
	}
	if n := b.ready(lot); n != 3 {
		t.Fatalf("after a refused replay the parking lot holds %d messages, want 3", n)
	}

	// All: the one within the window moves, the two past it stay.
	moved, err = inboxadmin.Replay(b.ctx, b.amqpURL, testConsumer, req)
	if !slices.Equal(moved, []string{recent}) || !errors.As(err, &past) || !sameIDs(past.IDs, old, rowless) {
		t.Fatalf("replay of all: moved %v, %v; want %s moved, %s and %s refused", moved, err, recent, old, rowless)
	}
	testenv.WaitFor(t, 10*time.Second, "one message in the work queue, two parked", func() bool {
		return b.ready(queue) == 1 && b.ready(lot) == 2
	})

	// The operator accepts it: both move.
	anyway := req
	anyway.PastWindow = true
	moved, err = inboxadmin.Replay(b.ctx, b.amqpURL, testConsumer, anyway)
	if err != nil || !sameIDs(moved, old, rowless) {
		t.Fatalf("replay past the window: moved %v, %v; want %s and %s", moved, err, old, rowless)
	}
	testenv.WaitFor(t, 10*time.Second, "three messages in the work queue", func() bool { return b.ready(queue) == 3 })
}

// sameIDs says whether got holds want, in any order: a scan that gave
// messages back may find them in another order.
func sameIDs(got []string, want ...string) bool {
	got, want = slices.Sorted(slices.Values(got)), slices.Sorted(slices.Values(want))
	return slices.Equal(got, want)
}
