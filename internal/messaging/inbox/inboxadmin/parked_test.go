package inbox_test

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/yourorg/orders/internal/messaging/inbox"
	"github.com/yourorg/orders/internal/testenv"
)

// Browsing a parking lot leaves every message where it was, in its order;
// a replay leaves alone a message it moved before (its own replay_id) and
// marks the copies it moves; a discard is recorded before the message goes.
func TestParkingLotBrowseReplayDiscard(t *testing.T) {
	t.Parallel()
	b := setupConsumer(t)
	topology := inbox.Topology{Consumer: testConsumer, Exchange: testExchange, Types: []string{typeCancelled},
		RetryDelays: []time.Duration{time.Second}, DeliveryLimit: 5}
	if err := topology.Declare(b.ch); err != nil {
		t.Fatal(err)
	}
	queue := inbox.QueueName(testConsumer)
	lot := inbox.ParkingLotName(queue)
	var ids []string
	for i := range 3 {
		msg := message()
		msg.Headers[inbox.HeaderParkedCode] = "handler_error"
		msg.Headers[inbox.HeaderParkedReason] = "handler_error: boom"
		msg.Headers[inbox.HeaderParkedAttempts] = int32(3)
		msg.Headers[inbox.HeaderParkedAggregateID] = "aggregate-1"
		if i == 1 { // moved by replay "run-1" before, and parked again
			msg.Headers[inbox.HeaderReplayID] = "run-1"
			msg.Headers[inbox.HeaderReplayCount] = int32(1)
		}
		b.publishTo("", lot, msg)
		ids = append(ids, msg.MessageId)
	}

	for range 2 {
		parked, err := inbox.Browse(b.ctx, b.amqpURL, testConsumer, 0)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, p := range parked {
			got = append(got, p.MessageID)
		}
		if !slices.Equal(got, ids) {
			t.Fatalf("browsed %v, want %v in that order", got, ids)
		}
		if p := parked[0]; p.ReasonCode != "handler_error" || p.Reason != "handler_error: boom" || p.Attempts != 3 || p.AggregateID != "aggregate-1" || len(p.Body) == 0 {
			t.Fatalf("parked message: %+v", p)
		}
		// Browse returns once the broker has them back: a command straight
		// after it finds all three.
		if n := b.ready(lot); n != 3 {
			t.Fatalf("right after browsing, the parking lot holds %d messages, want 3", n)
		}
	}

	moved, err := inbox.ReplayAs(b.ctx, b.amqpURL, testConsumer, inbox.ReplayRequest{}, "run-1")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{ids[0], ids[2]}; !slices.Equal(moved, want) {
		t.Fatalf("replay moved %v, want %v (not the one it had moved before)", moved, want)
	}
	testenv.WaitFor(t, 10*time.Second, "two messages in the work queue", func() bool { return b.ready(queue) == 2 })
	d, ok, err := b.ch.Get(queue, true)
	if err != nil || !ok {
		t.Fatalf("get from %s: %v %v", queue, ok, err)
	}
	if d.MessageId != ids[0] || d.Headers[inbox.HeaderReplayID] != "run-1" || d.Headers[inbox.HeaderReplayCount] != int32(1) ||
		d.Headers[inbox.HeaderParkedCode] != nil || d.Headers[inbox.HeaderReplayedAt] == nil {
		t.Fatalf("replayed copy: id %s, headers %v", d.MessageId, d.Headers)
	}

	var recorded []inbox.Parked
	record := func(p inbox.Parked) error { recorded = append(recorded, p); return nil }
	if _, err := inbox.Discard(b.ctx, b.amqpURL, testConsumer, ids[1], func(inbox.Parked) error { return errors.New("no audit") }); err == nil {
		t.Fatal("discard with a failing record: want an error")
	}
	if n := b.ready(lot); n != 1 {
		t.Fatalf("right after a discard whose record failed, the parking lot holds %d messages, want 1", n)
	}
	p, err := inbox.Discard(b.ctx, b.amqpURL, testConsumer, ids[1], record)
	if err != nil || p.MessageID != ids[1] || p.ReplayCount != 1 || len(recorded) != 1 {
		t.Fatalf("discard: %+v, %v, recorded %d", p, err, len(recorded))
	}
	testenv.WaitFor(t, 10*time.Second, "an empty parking lot", func() bool { return b.ready(lot) == 0 })
	if _, err := inbox.Discard(b.ctx, b.amqpURL, testConsumer, ids[1], record); !errors.Is(err, inbox.ErrNotParked) {
		t.Fatalf("discard of a message not there: %v", err)
	}
}
