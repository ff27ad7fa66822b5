package inboxadmin_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/yourorg/orders/internal/messaging"
	"github.com/yourorg/orders/internal/messaging/inbox"
	"github.com/yourorg/orders/internal/messaging/inbox/inboxadmin"
	"github.com/yourorg/orders/internal/testenv"
)

// Browsing a parking lot leaves every message where it was, in its order;
// a replay leaves alone a message it moved before (its own replay_id) and
// marks the copies it moves; a discard is recorded before the message goes.
func TestParkingLotBrowseReplayDiscard(t *testing.T) {
	t.Parallel()
	b := setupBroker(t)
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
		msg.Headers[inboxadmin.HeaderParkedCode] = "handler_error"
		msg.Headers[inboxadmin.HeaderParkedReason] = "handler_error: boom"
		msg.Headers[inboxadmin.HeaderParkedAttempts] = int32(3)
		msg.Headers[inboxadmin.HeaderParkedAggregateID] = "aggregate-1"
		if i == 1 { // moved by replay "run-1" before, and parked again
			msg.Headers[inboxadmin.HeaderReplayID] = "run-1"
			msg.Headers[inboxadmin.HeaderReplayCount] = int32(1)
		}
		b.publishTo("", lot, msg)
		ids = append(ids, msg.MessageId)
	}

	for range 2 {
		parked, err := inboxadmin.Browse(b.ctx, b.amqpURL, testConsumer, 0)
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

	moved, err := inboxadmin.ReplayAs(b.ctx, b.amqpURL, testConsumer, inboxadmin.ReplayRequest{}, "run-1")
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
	if d.MessageId != ids[0] || d.Headers[inboxadmin.HeaderReplayID] != "run-1" || d.Headers[inboxadmin.HeaderReplayCount] != int32(1) ||
		d.Headers[inboxadmin.HeaderParkedCode] != nil || d.Headers[inboxadmin.HeaderReplayedAt] == nil {
		t.Fatalf("replayed copy: id %s, headers %v", d.MessageId, d.Headers)
	}

	var recorded []inboxadmin.Parked
	record := func(p inboxadmin.Parked) error { recorded = append(recorded, p); return nil }
	if _, err := inboxadmin.Discard(b.ctx, b.amqpURL, testConsumer, ids[1], func(inboxadmin.Parked) error { return errors.New("no audit") }); err == nil {
		t.Fatal("discard with a failing record: want an error")
	}
	if n := b.ready(lot); n != 1 {
		t.Fatalf("right after a discard whose record failed, the parking lot holds %d messages, want 1", n)
	}
	p, err := inboxadmin.Discard(b.ctx, b.amqpURL, testConsumer, ids[1], record)
	if err != nil || p.MessageID != ids[1] || p.ReplayCount != 1 || len(recorded) != 1 {
		t.Fatalf("discard: %+v, %v, recorded %d", p, err, len(recorded))
	}
	testenv.WaitFor(t, 10*time.Second, "an empty parking lot", func() bool { return b.ready(lot) == 0 })
	if _, err := inboxadmin.Discard(b.ctx, b.amqpURL, testConsumer, ids[1], record); !errors.Is(err, inboxadmin.ErrNotParked) {
		t.Fatalf("discard of a message not there: %v", err)
	}
}

const (
	testConsumer  = "tester"
	testExchange  = "test.events"
	typeCancelled = "test.cancelled"
)

// broker is a vhost of the test's own, with a channel on it.
type broker struct {
	t       *testing.T
	ctx     context.Context
	amqpURL string
	ch      *amqp.Channel
}

func setupBroker(t *testing.T) *broker {
	t.Helper()
	b := &broker{t: t, ctx: t.Context(), amqpURL: testenv.NewVhost(t)}
	b.ch = testenv.NewChannel(t, b.amqpURL)
	if err := messaging.DeclareExchange(b.ch, testExchange); err != nil {
		t.Fatal(err)
	}
	return b
}

func message() amqp.Publishing {
	return amqp.Publishing{
		MessageId: uuid.NewString(), Type: typeCancelled, ContentType: messaging.ContentTypeJSON,
		DeliveryMode: amqp.Persistent, Headers: amqp.Table{messaging.HeaderMessageVersion: int32(1)},
		Body: []byte(fmt.Sprintf(`{"id":%q}`, uuid.NewString())),
	}
}

// publishTo sends msg and waits for the broker's confirm.
func (b *broker) publishTo(exchange, key string, msg amqp.Publishing) {
	b.t.Helper()
	ch := testenv.NewChannel(b.t, b.amqpURL)
	if err := ch.Confirm(false); err != nil {
		b.t.Fatal(err)
	}
	dc, err := ch.PublishWithDeferredConfirmWithContext(b.ctx, exchange, key, true, false, msg)
	if err != nil || !dc.Wait() {
		b.t.Fatalf("publish to %q %q: not confirmed (%v)", exchange, key, err)
	}
}

// ready is the number of messages ready in queue.
func (b *broker) ready(queue string) int {
	b.t.Helper()
	q, err := b.ch.QueueDeclarePassive(queue, true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
	if err != nil {
		b.t.Fatal(err)
	}
	return q.Messages
}
