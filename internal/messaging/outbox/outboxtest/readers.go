package outboxtest

import (
	"strings"
	"testing"
	"time"

	"github.com/yourorg/orders/internal/messaging"
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
	b.BindQueue("other", TypeFulfilled)
	cfg := Config()
	cfg.Readers = map[string][]string{TypeCancelled: {"reader-a", "reader-b"}, TypeFulfilled: {"other"}}
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
