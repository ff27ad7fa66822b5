package outbox_test

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
func TestRelayHoldsATypeUntilEveryReaderHasItsQueue(t *testing.T) {
	t.Parallel()
	b := setupRelay(t)
	b.bindQueue("reader-a", typeCancelled)
	b.bindQueue("other", typeFulfilled)
	cfg := testRelayConfig()
	cfg.Readers = map[string][]string{typeCancelled: {"reader-a", "reader-b"}, typeFulfilled: {"other"}}
	held := b.enqueue(5, messaging.Cause{}) // typeCancelled: reader-b has no queue yet
	if _, err := writer.Write(b.ctx, b.pool, messaging.Cause{}, testMessage{Type: typeFulfilled, ID: testenv.NewID()}); err != nil {
		t.Fatal(err)
	}
	r := b.startRelay(cfg, b.amqpURL, nil)

	if got := b.receive("other", 1, 15*time.Second, 0); len(got) != 1 {
		t.Fatalf("the type whose readers are all there: received %d", len(got))
	}
	var notReady error
	testenv.WaitFor(t, 10*time.Second, "the relay to say why it holds messages back", func() bool {
		notReady = r.Ready(b.ctx)
		return notReady != nil && strings.Contains(notReady.Error(), "reader-b")
	})
	time.Sleep(3 * testRelayConfig().PollInterval) // polls come and go: still held
	if got := b.statusCounts(); got["PENDING"] != len(held) {
		t.Fatalf("rows %v while reader-b has no queue; want the %d held rows PENDING", got, len(held))
	}
	if n := b.ready("reader-a"); n != 0 {
		t.Fatalf("reader-a got %d messages that reader-b would have lost", n)
	}

	b.bindQueue("reader-b", typeCancelled) // the late consumer declares its queue
	for _, q := range []string{"reader-a", "reader-b"} {
		if got := messageIDSet(b.receive(q, len(held), 15*time.Second, 0)); len(got) != len(held) {
			t.Fatalf("%s received %d of %d", q, len(got), len(held))
		}
	}
	testenv.WaitFor(t, 10*time.Second, "the relay to be ready", func() bool { return r.Ready(b.ctx) == nil })
	var attempts int
	if err := b.pool.QueryRow(b.ctx, "SELECT max(attempt_count) FROM message_outbox").Scan(&attempts); err != nil || attempts != 1 {
		t.Fatalf("max attempt_count %d (%v): holding a type back spends no attempt", attempts, err)
	}
	if got := b.metrics.Gauge(t, "relay.readers.missing"); got != 0 {
		t.Fatalf("relay.readers.missing = %d", got)
	}
}

func (b *relayBundle) ready(queue string) int {
	b.t.Helper()
	q, err := b.ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		b.t.Fatal(err)
	}
	return q.Messages
}
