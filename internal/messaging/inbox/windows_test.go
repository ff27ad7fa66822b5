package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/yourorg/orders/internal/messaging/inbox"
	"github.com/yourorg/orders/internal/messaging/inbox/inboxadmin"
	"github.com/yourorg/orders/internal/testenv"
)

// The failure windows of the consumers that lose nothing, stall nothing
// and park nothing only because of a mechanism built for them; each test
// here fails without it.

// The broker cancels the consumer (here: its work queue is deleted, as an
// operator's mistake or a queue re-declaration would). The consumer is not
// ready while it is not consuming, declares its topology again, and the
// messages published after that are processed.
func TestCancelledConsumerComesBack(t *testing.T) {
	t.Parallel()
	b := setupConsumer(t)
	rc := b.start(testConsumerConfig(), b.amqpURL, nil)
	if _, err := b.ch.QueueDelete(inbox.QueueName(testConsumer), false, false, false); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "the cancelled consumer to say it is not ready", func() bool { return rc.Ready(b.ctx) != nil })
	testenv.WaitFor(t, 30*time.Second, "the consumer to come back", func() bool { return rc.Ready(b.ctx) == nil })
	msg := message()
	b.publish(msg)
	if row := b.waitInbox(msg.MessageId, inbox.StatusProcessed); row.Attempts != 1 || b.effects(msg.MessageId) != 1 {
		t.Fatalf("after the comeback: %+v, %d effects", row, b.effects(msg.MessageId))
	}
}

// The channel the consumer publishes its retries and parkings on dies
// (the broker closes a channel on a refused publish). The next retry
// reopens it: the message goes round the retry queue and succeeds, instead
// of being given back to the broker again and again.
func TestDeadPublisherChannelIsReplaced(t *testing.T) {
	t.Parallel()
	b := setupConsumer(t)
	rc := b.start(testConsumerConfig(), b.amqpURL, nil)
	inbox.KillPublisherChannels(rc.Consumers)
	msg := message()
	b.handler.set(func(h *effectHandler) { h.failures[msg.MessageId] = 1 }) // one transient failure: a retry
	b.publish(msg)
	row := b.waitInbox(msg.MessageId, inbox.StatusProcessed)
	if row.Attempts != 2 || b.effects(msg.MessageId) != 1 {
		t.Fatalf("after the retry: %+v, %d effects", row, b.effects(msg.MessageId))
	}
	if got := b.counter("consumer.messages.requeued"); got != 0 {
		t.Fatalf("%d deliveries given back to the broker; the retry should have gone through a new channel", got)
	}
}

// The database answers pings but takes no writes (a read-only standby
// after a failover, or a database made read-only): the consumer holds its
// deliveries, unacknowledged, instead of sending them round the broker into
// the queue's delivery limit; it says it is not ready; nothing reaches the
// parking lot; and once writes work again every message is applied once.
func TestReadOnlyDatabaseHoldsDeliveries(t *testing.T) {
	t.Parallel()
	b := setupConsumer(t)
	cfg := testConsumerConfig()
	cfg.DeliveryLimit = 2 // the broker would park a message after 2 redeliveries
	rc := b.start(cfg, b.amqpURL, nil)
	b.setReadOnly(true)

	var msgs []amqp.Publishing
	for range 6 {
		msg := message()
		msgs = append(msgs, msg)
		b.publish(msg)
	}
	testenv.WaitFor(t, 15*time.Second, "the consumer to hold its deliveries", func() bool {
		err := rc.Ready(b.ctx)
		return err != nil && strings.Contains(err.Error(), "takes no writes")
	})
	time.Sleep(3 * time.Second) // long enough for many redeliveries, if there were any
	if n := b.ready(inbox.ParkingLotName(inbox.QueueName(testConsumer))); n != 0 {
		t.Fatalf("%d messages parked while the database was read-only", n)
	}
	if got := b.counter("consumer.messages.redelivered"); got != 0 {
		t.Fatalf("%d redeliveries while the database was read-only; the deliveries should be held", got)
	}
	if got := b.counter("consumer.messages.held"); got == 0 {
		t.Fatal("consumer.messages.held is 0")
	}

	b.setReadOnly(false)
	for _, msg := range msgs {
		if row := b.waitInbox(msg.MessageId, inbox.StatusProcessed); row.Attempts != 1 || b.effects(msg.MessageId) != 1 {
			t.Fatalf("message %s: %+v, %d effects", msg.MessageId, row, b.effects(msg.MessageId))
		}
	}
	testenv.WaitFor(t, 10*time.Second, "the consumer to be ready again", func() bool { return rc.Ready(b.ctx) == nil })
}

// PostgreSQL goes away under a running consumer (its connections cut, and
// new ones refused, by a proxy). Deliveries are held, not redelivered or
// parked; when it is back, each message is applied once.
func TestDatabaseGoneUnderRunningConsumer(t *testing.T) {
	t.Parallel()
	b := setupConsumer(t)
	proxy := testenv.NewProxy(t, testenv.HostPort(b.dbURL))
	b.consumerDB = proxy.Rewrite(b.dbURL)
	cfg := testConsumerConfig()
	cfg.DeliveryLimit = 2
	cfg.TxTimeout = time.Second
	rc := b.start(cfg, b.amqpURL, nil)

	proxy.Cut()
	var msgs []amqp.Publishing
	for range 5 {
		msg := message()
		msgs = append(msgs, msg)
		b.publish(msg)
	}
	testenv.WaitFor(t, 15*time.Second, "the consumer to hold its deliveries", func() bool { return b.counter("consumer.messages.held") > 0 })
	time.Sleep(2 * time.Second)
	if n := b.ready(inbox.ParkingLotName(inbox.QueueName(testConsumer))); n != 0 {
		t.Fatalf("%d messages parked while the database was away", n)
	}
	if rc.Ready(b.ctx) == nil {
		t.Fatal("ready while the database is away")
	}
	proxy.Restore()
	for _, msg := range msgs {
		if row := b.waitInbox(msg.MessageId, inbox.StatusProcessed); row.Attempts != 1 || b.effects(msg.MessageId) != 1 {
			t.Fatalf("message %s: %+v, %d effects", msg.MessageId, row, b.effects(msg.MessageId))
		}
	}
	if got := b.counter("consumer.messages.redelivered"); got != 0 {
		t.Fatalf("%d redeliveries while the database was away", got)
	}
}

// A message the broker parks on its own, after the work queue's delivery
// limit (here: a client that takes it and gives it back, again and again),
// is recognisable in the parking lot, and replaying it gives it a fresh
// start: the consumer processes it.
func TestDeliveryLimitParksRecognisablyAndReplays(t *testing.T) {
	t.Parallel()
	b := setupConsumer(t)
	cfg := testConsumerConfig()
	topo := inbox.Topology{Consumer: testConsumer, Exchange: testExchange, Types: []string{message().Type}, RetryDelays: cfg.RetryDelays, DeliveryLimit: cfg.DeliveryLimit}
	if err := topo.Declare(b.ch); err != nil {
		t.Fatal(err)
	}
	msg := message()
	b.publish(msg)
	// A crashing consumer: takes the message and gives it back, until the
	// broker dead-letters it.
	queue, dlq := inbox.QueueName(testConsumer), inbox.ParkingLotName(inbox.QueueName(testConsumer))
	for i := 0; b.ready(dlq) == 0; i++ {
		if i > 20 {
			t.Fatal("the broker never dead-lettered the message")
		}
		d, ok, err := b.ch.Get(queue, false)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			if err := d.Nack(false, true); err != nil {
				t.Fatal(err)
			}
		} else {
			time.Sleep(100 * time.Millisecond)
		}
	}
	d, ok, err := b.ch.Get(dlq, false)
	if err != nil || !ok {
		t.Fatalf("get from the parking lot: %v, %v", ok, err)
	}
	code, reason := inboxadmin.ParkedReason(d.Headers)
	if code != "delivery_limit" || !strings.Contains(reason, "CONSUMER_DELIVERY_LIMIT") {
		t.Fatalf("ParkedReason = %q, %q; want delivery_limit", code, reason)
	}
	if err := d.Nack(false, true); err != nil {
		t.Fatal(err)
	}

	b.start(cfg, b.amqpURL, nil)
	moved, err := inboxadmin.Replay(b.ctx, b.amqpURL, testConsumer, inboxadmin.ReplayRequest{Limit: 10})
	if err != nil || len(moved) != 1 {
		t.Fatalf("replay moved %v, %v", moved, err)
	}
	if row := b.waitInbox(msg.MessageId, inbox.StatusProcessed); b.effects(msg.MessageId) != 1 {
		t.Fatalf("after the replay: %+v, %d effects", row, b.effects(msg.MessageId))
	}
}

// setReadOnly makes the test's database read-only (or writable again) for
// new transactions, and cuts the consumers' sessions so that they pick the
// setting up, as a failover to a standby would.
func (b *consumerBundle) setReadOnly(on bool) {
	b.t.Helper()
	db := b.pool.Config().ConnConfig.Database
	admin, err := pgx.Connect(b.ctx, testenv.ServerURL(b.t, "postgres"))
	if err != nil {
		b.t.Fatal(err)
	}
	defer admin.Close(b.ctx)
	if _, err := admin.Exec(b.ctx, fmt.Sprintf("ALTER DATABASE %s SET default_transaction_read_only = %v", db, on)); err != nil {
		b.t.Fatal(err)
	}
	if _, err := admin.Exec(b.ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND application_name = 'consumer-under-test'", db); err != nil {
		b.t.Fatal(err)
	}
}

// A delivery's transaction loses a real deadlock: the handler takes
// advisory lock 1, then 2, while a session of the test holds 2 and asks for
// 1. The test's session waits longer before it looks for deadlocks, so
// PostgreSQL picks the consumer's transaction as the victim (40P01). The
// consumer runs the transaction again in place: the message is processed
// once, on its first attempt, and nothing goes round a retry queue.
func TestDeadlockIsRetriedInPlace(t *testing.T) {
	t.Parallel()
	b := setupConsumer(t)
	holder, err := b.pool.Acquire(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release()
	if _, err := holder.Exec(b.ctx, "SET deadlock_timeout = '30s'"); err != nil {
		t.Fatal(err)
	}
	tx, err := holder.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(b.ctx)) }()
	if _, err := tx.Exec(b.ctx, "SELECT pg_advisory_xact_lock(2)"); err != nil {
		t.Fatal(err)
	}

	holdsOne := make(chan struct{})
	testWaits := make(chan struct{})
	var calls atomic.Int64
	var lost atomic.Value // the error of the transaction that lost
	deadlocking := testerConsumer(func(ctx context.Context, tx pgx.Tx, d *inbox.Delivery) (inbox.Outcome, error) {
		first := calls.Add(1) == 1
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(1)"); err != nil {
			return inbox.Outcome{}, err
		}
		if first { // close the cycle only once the test's session waits for 1
			close(holdsOne)
			<-testWaits
		}
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(2)"); err != nil {
			lost.Store(err)
			return inbox.Outcome{}, err
		}
		if _, err := tx.Exec(ctx, "INSERT INTO test_effect (message_id) VALUES ($1)", d.MessageID); err != nil {
			return inbox.Outcome{}, err
		}
		return inbox.Applied(), nil
	})
	b.start(testConsumerConfig(), b.amqpURL, nil, deadlocking)
	msg := message()
	b.publish(msg)

	select {
	case <-holdsOne:
	case <-time.After(15 * time.Second):
		t.Fatal("the handler never took lock 1")
	}
	testerGot := make(chan error, 1)
	go func() {
		_, err := tx.Exec(b.ctx, "SELECT pg_advisory_xact_lock(1)")
		testerGot <- err
	}()
	testenv.WaitFor(t, 10*time.Second, "the test's session to wait for lock 1", func() bool {
		var waiting bool
		_ = b.pool.QueryRow(b.ctx, "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE pid = $1 AND NOT granted)", holder.Conn().PgConn().PID()).Scan(&waiting)
		return waiting
	})
	close(testWaits)
	if err := <-testerGot; err != nil {
		t.Fatalf("the test's session lost the deadlock instead: %v", err)
	}
	if err := tx.Rollback(b.ctx); err != nil { // lets the consumer's retry take lock 2
		t.Fatal(err)
	}

	row := b.waitInbox(msg.MessageId, inbox.StatusProcessed)
	var pgErr *pgconn.PgError
	if err, _ := lost.Load().(error); !errors.As(err, &pgErr) || pgErr.Code != "40P01" {
		t.Fatalf("the consumer's transaction did not lose a deadlock: %v", lost.Load())
	}
	if row.Attempts != 1 || calls.Load() != 2 || b.effects(msg.MessageId) != 1 {
		t.Fatalf("after the deadlock: %+v, %d handler runs, %d effects; want attempt 1, 2 runs, 1 effect", row, calls.Load(), b.effects(msg.MessageId))
	}
	if got := b.counter("consumer.messages.retried"); got != 0 {
		t.Fatalf("%d messages sent to a retry queue; a deadlock is retried in place", got)
	}
}

// The commit's outcome is unknown: the COMMIT reaches PostgreSQL and
// commits, but its answer never reaches the consumer (a proxy in front of
// the consumer's database lets nothing back from the moment the COMMIT is
// sent), and CONSUMER_TX_TIMEOUT cuts the wait. The consumer holds the
// delivery, tries again once the database answers, finds the message
// PROCESSED and acknowledges a duplicate: one effect.
func TestUnknownCommitOutcome(t *testing.T) {
	t.Parallel()
	b := setupConsumer(t)
	proxy := testenv.NewProxy(t, testenv.HostPort(b.dbURL))
	b.consumerDB = proxy.Rewrite(b.dbURL)
	stall := &commitStall{proxy: proxy}
	b.dbTracer = stall
	cfg := testConsumerConfig()
	cfg.TxTimeout = time.Second
	b.start(cfg, b.amqpURL, nil)

	stall.armed.Store(true)
	msg := message()
	b.publish(msg)
	testenv.WaitFor(t, 20*time.Second, "the redelivery to be a duplicate", func() bool { return b.counter("consumer.messages.duplicates") == 1 })
	if err, _ := stall.commitErr.Load().(error); err == nil {
		t.Fatal("the consumer heard its COMMIT's answer; the test did not cut it off")
	}
	row := b.inboxRow(msg.MessageId)
	if row.Status != inbox.StatusProcessed || row.Attempts != 1 || b.effects(msg.MessageId) != 1 {
		t.Fatalf("after the unknown outcome: %+v, %d effects; want PROCESSED on attempt 1, one effect", row, b.effects(msg.MessageId))
	}
	var followUps int
	if err := b.pool.QueryRow(b.ctx, "SELECT count(*) FROM message_outbox").Scan(&followUps); err != nil || followUps != 1 {
		t.Fatalf("%d follow-up messages (%v), want 1", followUps, err)
	}
	if held, retried := b.counter("consumer.messages.held"), b.counter("consumer.messages.retried"); held == 0 || retried != 0 {
		t.Fatalf("held %d, sent to a retry queue %d; want the delivery held, not retried", held, retried)
	}
}

// commitStall stalls the replies of the proxy when it sees, after it is
// armed, the COMMIT of the first transaction that writes an inbox row,
// and heals the proxy once that COMMIT has failed on the client's side.
// Only that one: the consumer's background loops (time partitions,
// table statistics) commit transactions of their own at any moment.
type commitStall struct {
	proxy     *testenv.Proxy
	armed     atomic.Bool
	conn      atomic.Pointer[pgx.Conn] // the connection that wrote the inbox row
	commitErr atomic.Value             // what the client got for the stalled COMMIT
}

type stalledCommit struct{}

func (c *commitStall) TraceQueryStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if c.armed.Load() && strings.Contains(data.SQL, "INSERT INTO message_inbox") {
		c.conn.CompareAndSwap(nil, conn)
	}
	if strings.EqualFold(data.SQL, "commit") && c.conn.Load() == conn && c.armed.CompareAndSwap(true, false) {
		c.proxy.StallReplies()
		return context.WithValue(ctx, stalledCommit{}, true)
	}
	return ctx
}

func (c *commitStall) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryEndData) {
	if ctx.Value(stalledCommit{}) != nil {
		if data.Err != nil {
			c.commitErr.Store(data.Err)
		}
		c.proxy.Heal()
	}
}

// Replay's connection is cut (a proxy) after it moved some messages:
// nothing is lost (each message is in the parking lot or the work queue, at
// least once: one that was being moved may be in both), and a second replay
// finishes. The consumer then applies each message once; the copies the
// cut left in both queues are absorbed as duplicates.
func TestReplayCutOffMidway(t *testing.T) {
	t.Parallel()
	b := setupConsumer(t)
	cfg := testConsumerConfig()
	topo := inbox.Topology{Consumer: testConsumer, Exchange: testExchange, Types: []string{typeCancelled}, RetryDelays: cfg.RetryDelays, DeliveryLimit: cfg.DeliveryLimit}
	if err := topo.Declare(b.ch); err != nil {
		t.Fatal(err)
	}
	queue, dlq := inbox.QueueName(testConsumer), inbox.ParkingLotName(inbox.QueueName(testConsumer))
	const n = 30
	want := map[string]bool{}
	for range n {
		msg := message()
		want[msg.MessageId] = true
		b.publishTo("", dlq, msg)
	}
	proxy := testenv.NewProxy(t, testenv.HostPort(b.amqpURL))
	proxy.Slow(20 * time.Millisecond) // each message takes a few round trips: the cut lands mid-replay

	type replayed struct {
		moved int
		err   error
	}
	done := make(chan replayed, 1)
	go func() {
		moved, err := inboxadmin.Replay(b.ctx, proxy.Rewrite(b.amqpURL), testConsumer, inboxadmin.ReplayRequest{Limit: n})
		done <- replayed{len(moved), err}
	}()
	testenv.WaitFor(t, 30*time.Second, "the replay to move some messages", func() bool { return b.ready(queue) >= 3 })
	proxy.Stall() // what is on the wire now is dropped: a Get answered, a publish half way
	proxy.Cut()
	first := <-done
	if first.err == nil || first.moved == 0 || first.moved >= n {
		t.Fatalf("the cut replay moved %d of %d and returned %v; want an error midway", first.moved, n, first.err)
	}

	// Nothing lost: every message is in one queue or the other. The
	// message the cut caught unacknowledged goes back to the parking lot.
	testenv.WaitFor(t, 10*time.Second, "every message back in a queue", func() bool { return b.ready(queue)+b.ready(dlq) >= n })
	seen := b.peek(queue, dlq)
	for id := range want {
		if seen[id] == 0 {
			t.Errorf("message %s is in neither queue: lost", id)
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	// The first replay counts only what the broker confirmed: a message
	// whose confirm the cut swallowed is in the work queue, uncounted.
	if moved, err := inboxadmin.Replay(b.ctx, b.amqpURL, testConsumer, inboxadmin.ReplayRequest{Limit: 2 * n}); err != nil {
		t.Fatalf("the second replay moved %d: %v", len(moved), err)
	}
	if left := b.ready(dlq); left != 0 {
		t.Fatalf("%d messages left in the parking lot", left)
	}
	b.start(cfg, b.amqpURL, nil)
	for id := range want {
		if row := b.waitInbox(id, inbox.StatusProcessed); row.Attempts != 1 || b.effects(id) != 1 {
			t.Fatalf("message %s: %+v, %d effects", id, row, b.effects(id))
		}
	}
}

// peek reads every message of the queues without taking them away (they
// go back when the channel closes) and counts them by message id.
func (b *consumerBundle) peek(queues ...string) map[string]int {
	b.t.Helper()
	ch := testenv.NewChannel(b.t, b.amqpURL)
	seen, total := map[string]int{}, 0
	for _, q := range queues {
		for {
			d, ok, err := ch.Get(q, false)
			if err != nil {
				b.t.Fatal(err)
			}
			if !ok {
				break
			}
			seen[d.MessageId]++
			total++
		}
	}
	// Closing the channel gives the messages back, unacknowledged; a
	// quorum queue takes them back after the close returns. Wait for them,
	// or what comes next finds the queues short.
	_ = ch.Close()
	testenv.WaitFor(b.t, 10*time.Second, "the peeked messages to be back", func() bool {
		ready := 0
		for _, q := range queues {
			ready += b.ready(q)
		}
		return ready >= total
	})
	return seen
}

// Database contention is the infrastructure's, not the message's: a
// message whose transaction keeps losing a lock timeout (another session
// holds its row) goes on round the retry queues past CONSUMER_MAX_ATTEMPTS
// and is never parked as poison; once the lock is gone it is applied once.
func TestLockTimeoutsNeverPoison(t *testing.T) {
	t.Parallel()
	b := setupConsumer(t)
	if _, err := b.pool.Exec(b.ctx, "CREATE TABLE test_lock (id int PRIMARY KEY); INSERT INTO test_lock VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	locker, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = locker.Rollback(b.ctx) }()
	if _, err := locker.Exec(b.ctx, "SELECT id FROM test_lock WHERE id = 1 FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	contended := testerConsumer(func(ctx context.Context, tx pgx.Tx, d *inbox.Delivery) (inbox.Outcome, error) {
		if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '100ms'"); err != nil {
			return inbox.Outcome{}, err
		}
		if _, err := tx.Exec(ctx, "SELECT id FROM test_lock WHERE id = 1 FOR UPDATE"); err != nil {
			return inbox.Outcome{}, err // 55P03 while the test holds the row
		}
		_, err := tx.Exec(ctx, "INSERT INTO test_effect (message_id) VALUES ($1)", d.MessageID)
		return inbox.Applied(), err
	})
	cfg := testConsumerConfig()
	cfg.MaxAttempts = 2
	b.start(cfg, b.amqpURL, nil, contended)
	msg := message()
	b.publish(msg)
	testenv.WaitFor(t, 30*time.Second, "attempts past CONSUMER_MAX_ATTEMPTS", func() bool {
		row := b.inboxRow(msg.MessageId)
		return row.Attempts > cfg.MaxAttempts+1 && row.Status == inbox.StatusRetryableFailed && row.LastErrorCode == "lock_timeout"
	})
	if n := b.ready(inbox.ParkingLotName(inbox.QueueName(testConsumer))); n != 0 {
		t.Fatalf("%d messages parked for lock timeouts", n)
	}
	if err := locker.Rollback(b.ctx); err != nil {
		t.Fatal(err)
	}
	if row := b.waitInbox(msg.MessageId, inbox.StatusProcessed); b.effects(msg.MessageId) != 1 {
		t.Fatalf("after the lock: %+v, %d effects", row, b.effects(msg.MessageId))
	}
}
