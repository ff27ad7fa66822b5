package outboxtest

import (
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/yourorg/orders/internal/messaging"
	"github.com/yourorg/orders/internal/messaging/outbox/internal/pipeline"
	"github.com/yourorg/orders/internal/testenv"
)

// The failure windows of the relay that lose nothing only because of a
// mechanism built for them; each test here fails without it.

// A backlog that no queue takes comes back as basic.returns. While the
// relay's marks are held up (a lock, a slow disk: here the test holds the
// first batch's marks for 12 s), more returns arrive than any buffer
// holds. The client drops a return it cannot hand over within 5 s, and the
// ack of that message then looks like a clean publish: without the return
// book, some of these rows would end PUBLISHED although the broker dropped
// them. With it, not one is.
func testReturnsAreNeverLostWhileMarksWait(t *testing.T, mode Mode) {
	t.Parallel()
	b := Setup(t, mode)
	const n = 3000 // order.fulfilled: no queue is bound to it in this vhost
	for range n / 500 {
		msgs := make([]messaging.Message, 500)
		for i := range msgs {
			msgs[i] = Message{Type: TypeFulfilled, ID: testenv.NewID()}
		}
		if _, err := Writer.Write(b.Ctx, b.Pool, messaging.Cause{}, msgs...); err != nil {
			t.Fatal(err)
		}
	}
	cfg := Config()
	cfg.BatchSize, cfg.MaxInFlight = 500, n
	cfg.ConfirmTimeout, cfg.Lease = 30*time.Second, 60*time.Second
	cfg.BackoffBase, cfg.BackoffMax = time.Hour, time.Hour // one attempt each in this test
	held := false
	b.StartRelay(cfg, b.AMQPURL, BeforeMark(func([]pipeline.Claim) error {
		if !held {
			held = true
			time.Sleep(12 * time.Second) // marks wait; the broker keeps returning
		}
		return nil
	}))
	testenv.WaitFor(t, 60*time.Second, "every row to be marked", func() bool {
		var marked int
		_ = b.Pool.QueryRow(b.Ctx, "SELECT count(*) FROM message_outbox WHERE status = 'PUBLISHED' OR last_error IS NOT NULL").Scan(&marked)
		return marked == n && b.StatusCounts()["PUBLISHING"] == 0
	})
	if c := b.StatusCounts(); c["PUBLISHED"] != 0 {
		t.Fatalf("%d unroutable rows marked PUBLISHED (their returns were lost); counts %v", c["PUBLISHED"], c)
	}
	var unroutable int
	if err := b.Pool.QueryRow(b.Ctx, "SELECT count(*) FROM message_outbox WHERE last_error LIKE 'unroutable%'").Scan(&unroutable); err != nil || unroutable != n {
		t.Fatalf("%d rows say unroutable (%v), want %d", unroutable, err, n)
	}
}

// Trouble that is not the message's own never spends its attempts: with
// RELAY_MAX_ATTEMPTS = 2, a row whose publishes are cut off again and again
// (here: no confirm ever comes, the broker connection stalled) is still
// PENDING with no attempt counted, and is published once the broker is
// back.
func testBrokerTroubleNeverSpendsAttempts(t *testing.T, mode Mode) {
	t.Parallel()
	b := Setup(t, mode)
	b.BindQueue("observer", TypeCancelled)
	proxy := testenv.NewProxy(t, testenv.HostPort(b.AMQPURL))
	cfg := Config()
	cfg.MaxAttempts = 2
	cfg.ConfirmTimeout = 300 * time.Millisecond
	relay := b.StartRelay(cfg, proxy.Rewrite(b.AMQPURL), nil)
	testenv.WaitFor(t, 10*time.Second, "the relay to connect", func() bool { return relay.Ready(b.Ctx) == nil })

	proxy.Stall()
	id := b.Enqueue(1, messaging.Cause{})[0]
	// Several publish attempts time out meanwhile (each session ends on a
	// missing confirm and reconnects through the stalled proxy).
	testenv.WaitFor(t, 20*time.Second, "publishes to time out", func() bool {
		if mode.Name == "wal" { // the log stream writes nothing back: it streams the row again
			return b.CounterWith("outbox.publish.attempts", "outcome", "timeout") >= 1
		}
		var lastError string
		_ = b.Pool.QueryRow(b.Ctx, "SELECT coalesce(last_error, '') FROM message_outbox WHERE outbox_id = $1", id).Scan(&lastError)
		return strings.Contains(lastError, "no publisher confirm")
	})
	time.Sleep(2 * time.Second)
	var status string
	var attempts int
	if err := b.Pool.QueryRow(b.Ctx, "SELECT status, attempt_count FROM message_outbox WHERE outbox_id = $1", id).Scan(&status, &attempts); err != nil {
		t.Fatal(err)
	}
	if status == "FAILED" || attempts > 1 {
		t.Fatalf("after broker trouble: %s with %d attempts counted; broker trouble must not spend them", status, attempts)
	}
	proxy.Heal()
	got := b.Receive("observer", 1, 30*time.Second, 0)
	if got[0].MessageId != id.String() {
		t.Fatalf("received %s, want %s", got[0].MessageId, id)
	}
}

// A real nack from the broker (the queue is full and rejects publishes) is
// the broker's trouble, not the message's: the row goes back to PENDING
// with no attempt spent, however often it is nacked, with the reason in
// last_error, while the next rows flow; once the broker takes it, it is
// published.
func testBrokerNackSpendsNoAttempt(t *testing.T, mode Mode) {
	t.Parallel()
	b := Setup(t, mode)
	b.FullQueue("full", TypeRejected)
	b.BindQueue("observer", TypeCancelled)
	rejected, err := Writer.Write(b.Ctx, b.Pool, messaging.Cause{}, Message{Type: TypeRejected, ID: testenv.NewID()})
	if err != nil {
		t.Fatal(err)
	}
	ok := b.Enqueue(5, messaging.Cause{})
	cfg := Config()
	cfg.MaxAttempts = 2
	b.StartRelay(cfg, b.AMQPURL, nil)
	if got := b.Receive("observer", len(ok), 20*time.Second, 0); len(got) != len(ok) {
		t.Fatalf("received %d of %d", len(got), len(ok))
	}
	row := func() (status, lastError string, attempts int) {
		_ = b.Pool.QueryRow(b.Ctx, "SELECT status, coalesce(last_error, ''), attempt_count FROM message_outbox WHERE outbox_id = $1", rejected[0]).
			Scan(&status, &lastError, &attempts)
		return
	}
	testenv.WaitFor(t, 20*time.Second, "more nacks than the row has attempts", func() bool {
		return b.CounterWith("outbox.publish.attempts", "outcome", "nacked") > int64(cfg.MaxAttempts)
	})
	if status, lastError, attempts := row(); status == "FAILED" || attempts > 1 || lastError != "nacked by RabbitMQ" {
		t.Fatalf("after %d nacks: %s, %d attempts, last_error %q; want it back in line with no attempt spent",
			b.CounterWith("outbox.publish.attempts", "outcome", "nacked"), status, attempts, lastError)
	}
	if got := b.Counter("outbox.failed"); got != 0 {
		t.Fatalf("outbox.failed = %d", got)
	}
	// The broker can take it now: it is published. The new queue first:
	// between the delete and the bind the message would be unroutable,
	// an attempt spent, and with MaxAttempts 2 the row FAILED.
	b.BindQueue("roomy", TypeRejected)
	if _, err := b.Ch.QueueDelete("full", false, false, false); err != nil {
		t.Fatal(err)
	}
	if got := b.Receive("roomy", 1, 30*time.Second, 0); got[0].MessageId != rejected[0].String() {
		t.Fatalf("received %s", got[0].MessageId)
	}
}

// A relay that is alive but slow outlives its lease (its marks held up
// past RELAY_LEASE): another relay takes the rows over and publishes them;
// the late relay's marks then change nothing, and every row ends
// PUBLISHED once, under the newer claim.
func testLiveRelayThatOutlivesItsLease(t *testing.T, mode Mode) {
	t.Parallel()
	b := Setup(t, mode)
	b.PollOnly("leases")
	b.BindQueue("observer", TypeCancelled)
	ids := b.Enqueue(20, messaging.Cause{})
	slowCfg := Config()
	slowCfg.Lease, slowCfg.ConfirmTimeout = 2*time.Second, time.Second
	// Its window holds exactly the rows it claims first, and they stay in
	// flight while its marks wait: it claims nothing more. Otherwise it
	// could win the rows back after each lease, faster than the second
	// relay, until their attempts ran out and they were FAILED.
	slowCfg.BatchSize, slowCfg.MaxInFlight = len(ids), len(ids)
	release := make(chan struct{})
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	slow := b.StartRelay(slowCfg, b.AMQPURL, BeforeMark(func([]pipeline.Claim) error {
		<-release // alive, but its marks wait past the lease
		return nil
	}))
	t.Cleanup(unblock) // cleanups run last first: this one before the relay's stop
	first := b.Receive("observer", len(ids), 60*time.Second, 0)
	if len(first) != len(ids) {
		t.Fatalf("received %d", len(first))
	}
	// A second relay recovers the expired claims and publishes again.
	b.StartRelay(Config(), b.AMQPURL, nil)
	again := b.Receive("observer", len(ids), 60*time.Second, 0)
	testenv.WaitFor(t, 60*time.Second, "every row PUBLISHED by the second relay", b.AllPublished(len(ids)))
	// Every row was recovered from the slow relay's expired lease, and its
	// attempt given back: a relay's trouble spends none of a row's.
	if got := b.Counter("outbox.lease.recovered"); got != int64(len(ids)) {
		t.Fatalf("%d rows recovered after the lease, want %d", got, len(ids))
	}
	var attempts int
	if err := b.Pool.QueryRow(b.Ctx, "SELECT max(attempt_count) FROM message_outbox").Scan(&attempts); err != nil || attempts != 1 {
		t.Fatalf("max attempt_count %d (%v), want 1", attempts, err)
	}
	unblock() // the late relay's marks now run: fenced out
	if err := slow.Stop(); err != nil {
		t.Fatal(err)
	}
	if c := b.StatusCounts(); c["PUBLISHED"] != len(ids) {
		t.Fatalf("counts after the late marks: %v", c)
	}
	if fmt.Sprint(messageIDSet(first)) != fmt.Sprint(messageIDSet(again)) {
		t.Fatal("the takeover published other message ids: a duplicate must keep its id")
	}
}

// The broker blocks publishers (a memory or disk alarm): it sends
// connection.blocked, here slipped into the relay's connection by a proxy,
// so that the shared broker raises no alarm of its own. While blocked, the
// relay claims nothing: rows committed meanwhile stay PENDING with no
// attempt spent. Once unblocked, they are published.
func testBlockedBrokerPausesClaiming(t *testing.T, mode Mode) {
	t.Parallel()
	b := Setup(t, mode)
	logs := &lockedBuffer{}
	b.Logger = slog.New(slog.NewTextHandler(logs, nil))
	b.BindQueue("observer", TypeCancelled)
	proxy := testenv.NewAMQPProxy(t, testenv.HostPort(b.AMQPURL))
	relay := b.StartRelay(Config(), proxy.Rewrite(b.AMQPURL), nil)
	testenv.WaitFor(t, 10*time.Second, "the relay to connect", func() bool { return relay.Ready(b.Ctx) == nil })

	proxy.Block("low on memory (injected by the test)")
	testenv.WaitFor(t, 10*time.Second, "the relay to see connection.blocked", func() bool {
		return strings.Contains(logs.String(), "RabbitMQ blocked publishing")
	})
	ids := b.Enqueue(20, messaging.Cause{})
	// Many poll intervals (100 ms) and a NOTIFY pass: a relay that claimed
	// while blocked would have claimed by now.
	time.Sleep(3 * time.Second)
	var claimed int
	if err := b.Pool.QueryRow(b.Ctx, "SELECT count(*) FROM message_outbox WHERE status <> 'PENDING' OR attempt_count > 0").Scan(&claimed); err != nil {
		t.Fatal(err)
	}
	if claimed != 0 {
		t.Fatalf("%d of %d rows claimed while the broker blocked publishing; counts %v", claimed, len(ids), b.StatusCounts())
	}

	proxy.Unblock()
	if got := b.Receive("observer", len(ids), 30*time.Second, 0); len(got) != len(ids) {
		t.Fatalf("received %d of %d after the unblock", len(got), len(ids))
	}
	testenv.WaitFor(t, 20*time.Second, "every row PUBLISHED after the unblock", b.AllPublished(len(ids)))
	var attempts int
	if err := b.Pool.QueryRow(b.Ctx, "SELECT max(attempt_count) FROM message_outbox").Scan(&attempts); err != nil || attempts != 1 {
		t.Fatalf("max attempt_count %d (%v), want 1: the block spent attempts", attempts, err)
	}
}

// lockedBuffer is a log sink that tests read while the relay writes.
type lockedBuffer struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// FullQueue declares a queue bound to key that holds nothing and rejects
// what overflows: every publish routed only to it is nacked.
func (b *Bundle) FullQueue(name, key string) {
	b.T.Helper()
	if _, err := b.Ch.QueueDeclare(name, true, false, false, false, amqp.Table{
		"x-queue-type": "classic", "x-max-length": int64(0), "x-overflow": "reject-publish",
	}); err != nil {
		b.T.Fatal(err)
	}
	if err := b.Ch.QueueBind(name, key, Exchange, false, nil); err != nil {
		b.T.Fatal(err)
	}
}
