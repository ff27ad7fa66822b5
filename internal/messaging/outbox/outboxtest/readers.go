package outboxtest

import (
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/yourorg/orders/internal/messaging"
	"github.com/yourorg/orders/internal/messaging/outbox"
	"github.com/yourorg/orders/internal/testenv"
)

// A message type with two readers is not published while one of them has
// no queue: mandatory would not return a message that reaches the other
// reader, and it would be lost for the missing one. The relay holds that
// type (its rows stay PENDING, no attempt spent), says why it is not
// ready, and publishes the rest; once the queue exists, the held messages
// reach both readers.
func testRelayHoldsATypeUntilEveryReaderHasItsQueue(t *testing.T, mode Mode) {
	t.Parallel()
	b := Setup(t, mode)
	b.BindQueue("reader-a", TypeCancelled)
	b.BindQueue("other", TypeFulfilled) // a reader the relay only looks for (no Bind)
	cfg := Config()
	cfg.Readers = map[string][]outbox.Reader{TypeCancelled: Readers("reader-a", "reader-b"), TypeFulfilled: {{Queue: "other"}}}
	held := b.Enqueue(5, messaging.Cause{}) // typeCancelled: reader-b has no queue yet
	if _, err := Writer.Write(b.Ctx, b.Pool, messaging.Cause{}, Message{Type: TypeFulfilled, ID: testenv.NewID()}); err != nil {
		t.Fatal(err)
	}
	r := b.StartRelay(cfg, b.AMQPURL, nil)

	if got := b.Receive("other", 1, 15*time.Second, 0); len(got) != 1 {
		t.Fatalf("the type whose readers are all there: received %d", len(got))
	}
	var notReady error
	testenv.WaitFor(t, 10*time.Second, "the relay to say why it holds messages back", func() bool {
		notReady = r.Ready(b.Ctx)
		return notReady != nil && strings.Contains(notReady.Error(), "reader-b")
	})
	time.Sleep(3 * Config().PollInterval) // polls come and go: still held
	if got := b.StatusCounts(); got["PENDING"] != len(held) {
		t.Fatalf("rows %v while reader-b has no queue; want the %d held rows PENDING", got, len(held))
	}
	if n := b.QueueReady("reader-a"); n != 0 {
		t.Fatalf("reader-a got %d messages that reader-b would have lost", n)
	}

	b.BindQueue("reader-b", TypeCancelled) // the late consumer declares its queue
	for _, q := range []string{"reader-a", "reader-b"} {
		if got := messageIDSet(b.Receive(q, len(held), 15*time.Second, 0)); len(got) != len(held) {
			t.Fatalf("%s received %d of %d", q, len(got), len(held))
		}
	}
	testenv.WaitFor(t, 10*time.Second, "the relay to be ready", func() bool { return r.Ready(b.Ctx) == nil })
	var attempts int
	if err := b.Pool.QueryRow(b.Ctx, "SELECT max(attempt_count) FROM message_outbox").Scan(&attempts); err != nil || attempts != 1 {
		t.Fatalf("max attempt_count %d (%v): holding a type back spends no attempt", attempts, err)
	}
	if got := b.Metrics.Gauge(t, "relay.readers.missing"); got != 0 {
		t.Fatalf("relay.readers.missing = %d", got)
	}
}

func (b *Bundle) QueueReady(queue string) int {
	b.T.Helper()
	q, err := b.Ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		b.T.Fatal(err)
	}
	return q.Messages
}

// A consumer declares its queue, then binds it: on a loaded machine, or
// across a restart, the bind can come polls later. A reader whose queue
// exists but is not bound yet must not be skipped: the relay binds it
// before it publishes, so every held message reaches it, however late
// its consumer's own bind comes.
func testAReaderThatBindsLateGetsEveryMessage(t *testing.T, mode Mode) {
	t.Parallel()
	b := Setup(t, mode)
	b.BindQueue("reader-a", TypeCancelled)
	cfg := Config()
	cfg.Readers = map[string][]outbox.Reader{TypeCancelled: Readers("reader-a", "reader-b")}
	held := b.Enqueue(5, messaging.Cause{})
	r := b.StartRelay(cfg, b.AMQPURL, nil)
	testenv.WaitFor(t, 10*time.Second, "the relay to hold the type", func() bool {
		err := r.Ready(b.Ctx)
		return err != nil && strings.Contains(err.Error(), "reader-b")
	})

	b.BindQueue("reader-b")                // declared, not bound yet
	time.Sleep(5 * Config().PollInterval)  // several looks find it there
	b.BindQueue("reader-b", TypeCancelled) // the bind, late
	for _, q := range []string{"reader-a", "reader-b"} {
		if got := messageIDSet(b.Receive(q, len(held), 15*time.Second, 0)); len(got) != len(held) {
			t.Fatalf("%s received %d of %d messages", q, len(got), len(held))
		}
	}
}

// Readers are queues bound to Exchange by message type, as BindQueue binds
// them: what the relay binds before it publishes a type they read.
func Readers(queues ...string) []outbox.Reader {
	readers := make([]outbox.Reader, len(queues))
	for i, q := range queues {
		readers[i] = outbox.Reader{Queue: q, Bind: func(ch *amqp.Channel, messageType string) error {
			return ch.QueueBind(q, messageType, Exchange, false, nil)
		}}
	}
	return readers
}
