package outbox_test

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/messaging"
	"github.com/yourorg/orders/internal/messaging/outbox"
	"github.com/yourorg/orders/internal/testenv"
)

// relayMode is the relay the suite runs: poll (the default) or wal
// (OUTBOX_TEST_RELAY_MODE=wal: the log-tailing relay, against a PostgreSQL
// of the test binary's own with wal_level=logical). make test runs the
// suite once per mode.
var relayMode = cmp.Or(os.Getenv("OUTBOX_TEST_RELAY_MODE"), "poll")

type relayBundle struct {
	t       testing.TB
	mode    string // poll or wal: the relays startRelay starts
	slot    string // the wal relays' replication slot
	ctx     context.Context
	pool    *pgxpool.Pool // the test's own connections
	dbURL   string
	amqpURL string
	ch      *amqp.Channel
	metrics *testenv.Metrics // shared by the test's relays
	logger  *slog.Logger     // the relays' logger; default testenv.Logger()
}

// setupRelay gives a test its own database and vhost, with the exchange
// declared, for relays of the suite's mode (relayMode).
func setupRelay(t testing.TB) *relayBundle {
	t.Helper()
	return setupRelayIn(t, relayMode)
}

// setupRelayIn is setupRelay for relays of mode (poll or wal).
func setupRelayIn(t testing.TB, mode string) *relayBundle {
	t.Helper()
	var db *testenv.Database
	if mode == "wal" {
		db = testenv.LogicalPostgres(t).NewDatabase(t, outbox.Schema)
	} else {
		db = testenv.NewDatabase(t, outbox.Schema)
	}
	b := &relayBundle{t: t, mode: mode, ctx: t.Context(), pool: db.Pool, dbURL: db.URL, amqpURL: testenv.NewVhost(t), slot: "relay_" + db.Name}
	if mode == "wal" {
		// The slot is made now, before the test opens any transaction of
		// its own: making a logical slot waits for every transaction open
		// on the server, and a test that holds one open until its relay
		// publishes would wait for itself. (The server's other tests' open
		// transactions only delay it.) A relay makes its slot itself on its
		// first start, as in production, when it is missing
		// (TestWALSlotLostFallsBackToTheRows).
		if _, err := db.Pool.Exec(b.ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", b.slot); err != nil {
			t.Fatal(err)
		}
	}
	b.ch = testenv.NewChannel(t, b.amqpURL)
	if err := messaging.DeclareExchange(b.ch, testExchange); err != nil {
		t.Fatal(err)
	}
	b.metrics = testenv.NewMetrics()
	return b
}

// bindQueue declares a quorum queue bound to the exchange with keys.
func (b *relayBundle) bindQueue(name string, keys ...string) {
	b.t.Helper()
	if _, err := b.ch.QueueDeclare(name, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		b.t.Fatal(err)
	}
	for _, k := range keys {
		if err := b.ch.QueueBind(name, k, testExchange, false, nil); err != nil {
			b.t.Fatal(err)
		}
	}
}

const relayAppName = "outbox-relay-under-test"

// writer writes the tests' messages, as order-api would.
var writer = outbox.Writer{Producer: "test-producer", Exchange: testExchange, AggregateType: "test"}

// testRelayConfig is fast: short polls, leases, timeouts and backoffs.
func testRelayConfig() outbox.Config {
	return outbox.Config{
		BatchSize:       100,
		MaxInFlight:     400,
		PollInterval:    100 * time.Millisecond,
		Lease:           5 * time.Second,
		ConfirmTimeout:  2 * time.Second,
		MaxAttempts:     5,
		BackoffBase:     10 * time.Millisecond,
		BackoffMax:      100 * time.Millisecond,
		ShutdownTimeout: 2 * time.Second,
	}
}

type runningRelay struct {
	relayUnderTest
	stop func() error // cancels Run and returns what it returned
	done chan struct{}
}

// relayUnderTest is an *outbox.Relay or, in wal mode, an *outbox.WALRelay.
type relayUnderTest interface {
	Run(ctx context.Context) error
	Ready(ctx context.Context) error
	ID() string
}

// pollOnly skips a test of what only the polling relay does (claims,
// leases, partitions), or of what does not depend on the relay (the
// writer), when the suite runs the log-tailing relay.
func (b *relayBundle) pollOnly(what string) {
	b.t.Helper()
	if b.mode != "poll" {
		b.t.Skipf("%s: tested in poll mode only (this run: OUTBOX_TEST_RELAY_MODE=%s)", what, b.mode)
	}
}

// testWALConfig is fast: a heartbeat and position reports well under a
// second, and a short sweep delay.
func (b *relayBundle) testWALConfig() outbox.WALConfig {
	return outbox.WALConfig{Slot: b.slot, Heartbeat: 200 * time.Millisecond, SweepAfter: 5 * time.Second,
		StatusInterval: 100 * time.Millisecond}
}

// dropSlot drops a test's replication slot, ending the session that still
// streams it, if any.
func dropSlot(t testing.TB, pool *pgxpool.Pool, slot string) {
	ctx := context.Background()
	for try := 0; try < 50; try++ {
		_, _ = pool.Exec(ctx, "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL", slot)
		_, err := pool.Exec(ctx, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1", slot)
		if err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Errorf("replication slot %s could not be dropped", slot)
}

// startRelay runs a relay until the test ends or stop is called.
func (b *relayBundle) startRelay(cfg outbox.Config, amqpURL string, faults outbox.Faults) *runningRelay {
	b.t.Helper()
	// Each relay has a pool of its own, as in production, named so that a
	// test can find (and kill) its sessions.
	pool, err := database.NewPool(b.ctx, database.PoolConfig{URL: b.dbURL, AppName: relayAppName, AsyncCommit: true})
	if err != nil {
		b.t.Fatal(err)
	}
	b.t.Cleanup(pool.Close)
	cfg.Faults = faults
	deps := messaging.Deps{
		Pool: pool, AMQPURL: amqpURL, Logger: cmp.Or(b.logger, testenv.Logger()),
		MeterProvider: b.metrics.Provider,
	}
	var r relayUnderTest
	if b.mode == "wal" {
		r, err = outbox.NewWALRelay(cfg, b.testWALConfig(), deps)
	} else {
		r, err = outbox.NewRelay(cfg, deps)
	}
	if err != nil {
		b.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	rr := &runningRelay{relayUnderTest: r, done: make(chan struct{})}
	var runErr error
	go func() {
		defer close(rr.done)
		runErr = r.Run(ctx)
	}()
	rr.stop = func() error {
		cancel()
		<-rr.done
		return runErr
	}
	b.t.Cleanup(func() { _ = rr.stop() })
	return rr
}

// enqueue commits n order.cancelled messages, in transactions of up to 500.
func (b *relayBundle) enqueue(n int, cause messaging.Cause) []uuid.UUID {
	b.t.Helper()
	var ids []uuid.UUID
	for n > 0 {
		size := min(n, 500)
		msgs := make([]messaging.Message, size)
		for i := range msgs {
			msgs[i] = testMessage{Type: typeCancelled, ID: uuid.Must(uuid.NewV7())}
		}
		err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
			got, err := writer.Write(b.ctx, tx, cause, msgs...)
			ids = append(ids, got...)
			return err
		})
		if err != nil {
			b.t.Fatal(err)
		}
		n -= size
	}
	return ids
}

// receive consumes queue until want messages arrived (or timeout) and
// returns them. It keeps listening for quiet a moment longer, to catch
// duplicates.
func (b *relayBundle) receive(queue string, want int, timeout, quiet time.Duration) []amqp.Delivery {
	b.t.Helper()
	conn, err := amqp.Dial(b.amqpURL)
	if err != nil {
		b.t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		b.t.Fatal(err)
	}
	deliveries, err := ch.Consume(queue, "", true, false, false, false, nil)
	if err != nil {
		b.t.Fatal(err)
	}
	var got []amqp.Delivery
	deadline := time.After(timeout)
	for len(got) < want {
		select {
		case d := <-deliveries:
			got = append(got, d)
		case <-deadline:
			b.t.Fatalf("received %d of %d messages from %s", len(got), want, queue)
		}
	}
	for {
		select {
		case d := <-deliveries:
			got = append(got, d)
		case <-time.After(quiet):
			return got
		}
	}
}

func (b *relayBundle) statusCounts() map[string]int {
	b.t.Helper()
	rows, err := b.pool.Query(b.ctx, "SELECT status, count(*) FROM message_outbox GROUP BY status")
	if err != nil {
		b.t.Fatal(err)
	}
	counts := map[string]int{}
	for rows.Next() {
		var s string
		var n int
		if err := rows.Scan(&s, &n); err != nil {
			b.t.Fatal(err)
		}
		counts[s] = n
	}
	return counts
}

func (b *relayBundle) allPublished(n int) func() bool {
	return func() bool { return b.statusCounts()["PUBLISHED"] == n }
}

func (b *relayBundle) counter(name string) int64 {
	b.t.Helper()
	return b.metrics.Counter(b.t, name)
}

func (b *relayBundle) counterWith(name, key, value string) int64 {
	b.t.Helper()
	return b.metrics.CounterWith(b.t, name, key, value)
}

// The message carries the envelope (docs/messaging.md), and its row ends
// PUBLISHED.
func TestRelayPublishesTheEnvelope(t *testing.T) {
	t.Parallel()
	b := setupRelay(t)
	b.bindQueue("observer", "#")
	ids := b.enqueue(1, messaging.Cause{CorrelationID: "corr-1", MessageID: "cause-1"})
	b.startRelay(testRelayConfig(), b.amqpURL, nil)

	d := b.receive("observer", 1, 10*time.Second, 0)[0]
	if d.MessageId != ids[0].String() || d.Type != typeCancelled || d.ContentType != "application/json" ||
		d.DeliveryMode != amqp.Persistent || d.CorrelationId != "corr-1" || d.AppId != "test-producer" ||
		d.Exchange != testExchange || d.RoutingKey != typeCancelled || d.Timestamp.IsZero() {
		t.Fatalf("envelope: %+v", d)
	}
	if d.Headers[messaging.HeaderMessageVersion] != int32(1) || d.Headers["causation_id"] != "cause-1" || d.Headers["correlation_id"] != "corr-1" {
		t.Fatalf("headers: %v", d.Headers)
	}
	if _, leaked := d.Headers["app_id"]; leaked {
		t.Fatalf("app_id travels as a property, not a header: %v", d.Headers)
	}
	var body testMessage
	if err := json.Unmarshal(d.Body, &body); err != nil || body.ID == uuid.Nil {
		t.Fatalf("body %s: %v", d.Body, err)
	}
	testenv.WaitFor(t, 5*time.Second, "the row to be PUBLISHED", b.allPublished(1))
	var publishedAt *time.Time
	var claimedBy *string
	if err := b.pool.QueryRow(b.ctx, "SELECT published_at, claimed_by FROM message_outbox").Scan(&publishedAt, &claimedBy); err != nil || publishedAt == nil || claimedBy != nil {
		t.Fatalf("published_at %v claimed_by %v: %v", publishedAt, claimedBy, err)
	}
	if got := b.counter("outbox.published"); got != 1 {
		t.Fatalf("outbox.published = %d", got)
	}
}

// Three relays over 2,000 rows: every row ends PUBLISHED and reaches the
// queue at least once; no row is ever claimed by two relays at once (every
// row was claimed exactly once: attempt_count 1, and each claim was marked
// by one relay only).
func TestThreeRelaysShareTheBacklog(t *testing.T) {
	t.Parallel()
	b := setupRelay(t)
	b.bindQueue("observer", "#")
	const rows = 2000
	ids := b.enqueue(rows, messaging.Cause{})

	var mu sync.Mutex
	markedBy := map[uuid.UUID][]string{}
	hook := func(name string) outbox.Faults {
		return outbox.BeforeMark(func(claims []outbox.Claim) error {
			mu.Lock()
			defer mu.Unlock()
			for _, c := range claims {
				markedBy[c.ID] = append(markedBy[c.ID], fmt.Sprintf("%s#%d", name, c.Attempt))
			}
			return nil
		})
	}
	for i := range 3 {
		cfg := testRelayConfig()
		cfg.BatchSize = 50 // small batches, so that the relays interleave
		b.startRelay(cfg, b.amqpURL, hook(fmt.Sprint("relay-", i)))
	}
	testenv.WaitFor(t, 60*time.Second, "every row to be PUBLISHED", b.allPublished(rows))

	got := b.receive("observer", rows, 30*time.Second, 500*time.Millisecond)
	seen := map[string]int{}
	for _, d := range got {
		seen[d.MessageId]++
	}
	duplicates := len(got) - len(seen)
	for _, id := range ids {
		if seen[id.String()] == 0 {
			t.Fatalf("row %s never reached the queue", id)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	perRelay := map[string]int{}
	for id, marks := range markedBy {
		if len(marks) != 1 {
			t.Errorf("row %s was confirmed under %d claims: %v", id, len(marks), marks)
		}
		perRelay[strings.Split(marks[0], "#")[0]]++
	}
	var maxAttempt int
	if err := b.pool.QueryRow(b.ctx, "SELECT max(attempt_count) FROM message_outbox").Scan(&maxAttempt); err != nil || maxAttempt != 1 {
		t.Fatalf("max attempt_count = %d (%v): a row was claimed twice", maxAttempt, err)
	}
	t.Logf("%d rows, %d deliveries, %d duplicates; rows per relay: %v", rows, len(got), duplicates, perRelay)
}

// A crash after the broker's confirm and before the database mark: the row
// stays PUBLISHING, comes back when the lease ends, and is published again
// with the same message_id.
func TestCrashBetweenConfirmAndMarkRepublishesSameMessageID(t *testing.T) {
	t.Parallel()
	b := setupRelay(t)
	b.bindQueue("observer", "#")
	ids := b.enqueue(3, messaging.Cause{})

	cfg := testRelayConfig()
	cfg.Lease = 3 * time.Second
	crashed := b.startRelay(cfg, b.amqpURL, outbox.BeforeMark(func([]outbox.Claim) error { return errors.New("injected crash") }))
	first := b.receive("observer", 3, 10*time.Second, 0)
	select {
	case <-crashed.done:
	case <-time.After(30 * time.Second):
		t.Fatal("the relay did not end within 30s of its injected crash")
	}
	if err := crashed.stop(); err == nil || !strings.Contains(err.Error(), "injected crash") {
		t.Fatalf("crashed relay returned %v", err)
	}
	// The polling relay's rows wait for their lease; the log stream's were
	// never written back, and the slot streams them again.
	if want := map[string]string{"poll": "PUBLISHING", "wal": "PENDING"}[relayMode]; b.statusCounts()[want] != 3 {
		t.Fatalf("after the crash: %v, want 3 %s", b.statusCounts(), want)
	}

	b.startRelay(testRelayConfig(), b.amqpURL, nil)
	second := b.receive("observer", 3, 20*time.Second, 0)
	testenv.WaitFor(t, 10*time.Second, "the rows to be PUBLISHED", b.allPublished(3))

	want := map[string]bool{}
	for _, id := range ids {
		want[id.String()] = true
	}
	for _, d := range append(first, second...) {
		if !want[d.MessageId] {
			t.Fatalf("unexpected message_id %s", d.MessageId)
		}
	}
	firstIDs, secondIDs := messageIDs(first), messageIDs(second)
	if fmt.Sprint(firstIDs) != fmt.Sprint(secondIDs) {
		t.Fatalf("republished %v, first published %v", secondIDs, firstIDs)
	}
	if relayMode == "wal" {
		return
	}
	// Recovered after the crashed relay's lease, the attempt it claimed
	// given back: only the second relay's counts.
	var attempts int
	_ = b.pool.QueryRow(b.ctx, "SELECT min(attempt_count) FROM message_outbox").Scan(&attempts)
	if got := b.counter("outbox.lease.recovered"); attempts != 1 || got != 3 {
		t.Fatalf("attempt_count = %d, %d rows recovered; want 1 and 3", attempts, got)
	}
}

func messageIDs(ds []amqp.Delivery) []string {
	ids := make([]string, len(ds))
	for i, d := range ds {
		ids[i] = d.MessageId
	}
	slices.Sort(ids)
	return ids
}

// An unroutable message (no queue bound for its type) is returned by the
// broker; with mandatory it is never marked PUBLISHED: it is retried, then
// FAILED with "unroutable", while the other rows flow.
func TestUnroutableMessageEndsFailedWhileOthersFlow(t *testing.T) {
	t.Parallel()
	b := setupRelay(t)
	b.bindQueue("cancelled-only", typeCancelled)
	good := b.enqueue(20, messaging.Cause{})
	var unroutable uuid.UUID
	err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		ids, err := writer.Write(b.ctx, tx, messaging.Cause{}, testMessage{Type: typeFulfilled, ID: uuid.New()})
		unroutable = ids[0]
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	more := b.enqueue(20, messaging.Cause{})

	cfg := testRelayConfig()
	cfg.MaxAttempts = 3
	b.startRelay(cfg, b.amqpURL, nil)

	got := b.receive("cancelled-only", len(good)+len(more), 10*time.Second, 0)
	if len(got) != 40 {
		t.Fatalf("received %d", len(got))
	}
	var status, lastError string
	var attempts int
	testenv.WaitFor(t, 10*time.Second, "the unroutable row to be FAILED", func() bool {
		_ = b.pool.QueryRow(b.ctx, "SELECT status, coalesce(last_error, ''), attempt_count FROM message_outbox WHERE outbox_id = $1", unroutable).
			Scan(&status, &lastError, &attempts)
		return status == "FAILED"
	})
	if !strings.Contains(lastError, "unroutable") || attempts != 3 {
		t.Fatalf("FAILED row: attempts %d, last_error %q", attempts, lastError)
	}
	// The rows are marked after their confirms, so some of the 40 received
	// may not be PUBLISHED yet.
	var counts map[string]int
	testenv.WaitFor(t, 10*time.Second, "the 40 routable rows to be PUBLISHED", func() bool {
		counts = b.statusCounts()
		return counts["PUBLISHED"] == 40
	})
	if counts["FAILED"] != 1 || len(counts) != 2 {
		t.Fatalf("status counts %v, want 40 PUBLISHED and 1 FAILED", counts)
	}
	if got := b.counter("outbox.unroutable"); got != 3 {
		t.Fatalf("outbox.unroutable = %d, want 3", got)
	}
}

// The broker goes away (the connection is cut) while rows are pending:
// nothing is marked, and everything is published once it is back.
func TestBrokerDownNothingMarkedEverythingPublishedAfter(t *testing.T) {
	t.Parallel()
	b := setupRelay(t)
	b.bindQueue("observer", "#")
	proxy := testenv.NewProxy(t, testenv.HostPort(b.amqpURL))
	relay := b.startRelay(testRelayConfig(), proxy.Rewrite(b.amqpURL), nil)
	testenv.WaitFor(t, 10*time.Second, "the relay to connect", func() bool { return relay.Ready(b.ctx) == nil })

	proxy.Cut()
	testenv.WaitFor(t, 10*time.Second, "the relay to notice", func() bool { return relay.Ready(b.ctx) != nil })
	ids := b.enqueue(300, messaging.Cause{})
	time.Sleep(time.Second) // the relay keeps trying to reconnect meanwhile
	if c := b.statusCounts(); c["PENDING"] != len(ids) {
		t.Fatalf("while the broker is down: %v, want all %d PENDING", c, len(ids))
	}

	proxy.Restore()
	testenv.WaitFor(t, 30*time.Second, "every row to be PUBLISHED", b.allPublished(len(ids)))
	got := b.receive("observer", len(ids), 10*time.Second, 0)
	if len(messageIDSet(got)) != len(ids) {
		t.Fatalf("received %d distinct of %d", len(messageIDSet(got)), len(ids))
	}
}

// The connection drops in the middle of a backlog: whatever was in flight
// is retried, and every row reaches the queue at least once.
func TestConnectionLostMidBacklog(t *testing.T) {
	t.Parallel()
	b := setupRelay(t)
	b.bindQueue("observer", "#")
	proxy := testenv.NewProxy(t, testenv.HostPort(b.amqpURL))
	ids := b.enqueue(3000, messaging.Cause{})
	b.startRelay(testRelayConfig(), proxy.Rewrite(b.amqpURL), nil)

	testenv.WaitFor(t, 30*time.Second, "some rows to be published", func() bool { return b.statusCounts()["PUBLISHED"] > 300 })
	proxy.Cut()
	time.Sleep(300 * time.Millisecond)
	proxy.Restore()

	testenv.WaitFor(t, 60*time.Second, "every row to be PUBLISHED", b.allPublished(len(ids)))
	got := b.receive("observer", len(ids), 30*time.Second, 500*time.Millisecond)
	if set := messageIDSet(got); len(set) != len(ids) {
		t.Fatalf("received %d distinct of %d", len(set), len(ids))
	}
	t.Logf("%d rows, %d deliveries (%d duplicates from the cut)", len(ids), len(got), len(got)-len(ids))
}

func messageIDSet(ds []amqp.Delivery) map[string]bool {
	set := map[string]bool{}
	for _, d := range ds {
		set[d.MessageId] = true
	}
	return set
}

// A confirm that never comes (a black-holed network): the rows go back to
// PENDING with the reason, the relay reconnects, and they are published.
func TestConfirmTimeoutRetries(t *testing.T) {
	t.Parallel()
	b := setupRelay(t)
	b.bindQueue("observer", "#")
	proxy := testenv.NewProxy(t, testenv.HostPort(b.amqpURL))
	relay := b.startRelay(testRelayConfig(), proxy.Rewrite(b.amqpURL), nil)
	testenv.WaitFor(t, 10*time.Second, "the relay to connect", func() bool { return relay.Ready(b.ctx) == nil })

	proxy.Stall()
	b.enqueue(10, messaging.Cause{})
	var lastError string
	testenv.WaitFor(t, 15*time.Second, "a confirm timeout to be recorded", func() bool {
		if relayMode == "wal" { // the log stream writes nothing back: it streams the rows again
			return b.counterWith("outbox.publish.attempts", "outcome", "timeout") >= 1
		}
		_ = b.pool.QueryRow(b.ctx, "SELECT coalesce(max(last_error), '') FROM message_outbox").Scan(&lastError)
		return strings.Contains(lastError, "no publisher confirm")
	})
	proxy.Heal()
	testenv.WaitFor(t, 30*time.Second, "every row to be PUBLISHED", b.allPublished(10))
	if got := messageIDSet(b.receive("observer", 10, 10*time.Second, 0)); len(got) != 10 {
		t.Fatalf("received %d distinct", len(got))
	}
}

// On shutdown the relay stops claiming, waits for outstanding confirms up to
// its deadline, and hands the unconfirmed rows back (PENDING, attempt not
// counted) for the next relay.
func TestShutdownHandsBackUnconfirmedRows(t *testing.T) {
	t.Parallel()
	b := setupRelay(t)
	b.bindQueue("observer", "#")
	proxy := testenv.NewProxy(t, testenv.HostPort(b.amqpURL))
	cfg := testRelayConfig()
	cfg.ConfirmTimeout = 4 * time.Second
	cfg.ShutdownTimeout = 500 * time.Millisecond
	relay := b.startRelay(cfg, proxy.Rewrite(b.amqpURL), nil)
	testenv.WaitFor(t, 10*time.Second, "the relay to connect", func() bool { return relay.Ready(b.ctx) == nil })

	proxy.Stall() // publishes go out, confirms never come back
	b.enqueue(5, messaging.Cause{})
	testenv.WaitFor(t, 5*time.Second, "the rows to be published", func() bool {
		if relayMode == "wal" { // the log stream claims nothing: the rows stay PENDING
			return b.metrics.Gauge(t, "relay.in_flight") == 5
		}
		return b.statusCounts()["PUBLISHING"] == 5
	})
	if err := relay.stop(); err != nil {
		t.Fatal(err)
	}
	var maxAttempt int
	_ = b.pool.QueryRow(b.ctx, "SELECT max(attempt_count) FROM message_outbox").Scan(&maxAttempt)
	if c := b.statusCounts(); c["PENDING"] != 5 || maxAttempt != 0 {
		t.Fatalf("after shutdown: %v, max attempt %d; want 5 PENDING, attempts not counted", c, maxAttempt)
	}
	proxy.Heal()
	b.startRelay(testRelayConfig(), b.amqpURL, nil)
	testenv.WaitFor(t, 10*time.Second, "every row to be PUBLISHED", b.allPublished(5))
}

// A claimed row whose relay vanished (no process will ever mark it)
// becomes claimable when its lease ends, and is published.
func TestVanishedRelaysRowsComeBackAfterTheLease(t *testing.T) {
	t.Parallel()
	b := setupRelay(t)
	b.pollOnly("leases (the log stream's equivalent: TestWALStandbyTakesOver)")
	b.bindQueue("observer", "#")
	ids := b.enqueue(4, messaging.Cause{})
	claimed, err := outbox.ClaimRows(b.ctx, b.pool, "ghost-relay", 10, time.Second)
	if err != nil || len(claimed) != 4 {
		t.Fatalf("ghost claim: %d rows, %v", len(claimed), err)
	}
	b.startRelay(testRelayConfig(), b.amqpURL, nil)

	got := b.receive("observer", 4, 15*time.Second, 0)
	if len(messageIDSet(got)) != len(ids) {
		t.Fatalf("received %d", len(got))
	}
	testenv.WaitFor(t, 5*time.Second, "every row to be PUBLISHED", b.allPublished(4))
	var attempts int
	_ = b.pool.QueryRow(b.ctx, "SELECT min(attempt_count) FROM message_outbox").Scan(&attempts)
	if attempts != 1 {
		t.Fatalf("attempt_count = %d, want 1: ours (the ghost's was given back with its lease)", attempts)
	}
	if got := b.counter("outbox.lease.recovered"); got != 4 {
		t.Fatalf("outbox.lease.recovered = %d", got)
	}
}

// Rows committed out of order, a long-open transaction holding an outbox
// row, and a rolled-back transaction: every committed row is published,
// the rolled-back one never.
func TestCommitOrderAndRollbacks(t *testing.T) {
	t.Parallel()
	b := setupRelay(t)
	b.bindQueue("observer", "#")
	b.startRelay(testRelayConfig(), b.amqpURL, nil)

	enqueueIn := func(tx pgx.Tx) uuid.UUID {
		ids, err := writer.Write(b.ctx, tx, messaging.Cause{}, testMessage{Type: typeCancelled, ID: uuid.New()})
		if err != nil {
			t.Fatal(err)
		}
		return ids[0]
	}
	// The long transaction writes first (older created_at and id) and
	// stays open.
	long, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	older := enqueueIn(long)
	// A later transaction commits first.
	var newer uuid.UUID
	if err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error { newer = enqueueIn(tx); return nil }); err != nil {
		t.Fatal(err)
	}
	// One more rolls back.
	rolledBack, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	ghost := enqueueIn(rolledBack)
	if err := rolledBack.Rollback(b.ctx); err != nil {
		t.Fatal(err)
	}

	first := b.receive("observer", 1, 10*time.Second, 300*time.Millisecond)
	if len(first) != 1 || first[0].MessageId != newer.String() {
		t.Fatalf("while the long transaction is open: %v", messageIDs(first))
	}
	if err := long.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	second := b.receive("observer", 1, 10*time.Second, 500*time.Millisecond)
	if len(second) != 1 || second[0].MessageId != older.String() {
		t.Fatalf("after the long transaction commits: %v", messageIDs(second))
	}
	testenv.WaitFor(t, 5*time.Second, "both rows to be PUBLISHED", b.allPublished(2))
	var n int
	_ = b.pool.QueryRow(b.ctx, "SELECT count(*) FROM message_outbox WHERE outbox_id = $1", ghost).Scan(&n)
	if n != 0 {
		t.Fatal("the rolled-back row exists")
	}
}

// A committed row is published on its NOTIFY, long before the poll (set to
// an hour here) would find it.
func TestNotifyWakesTheRelay(t *testing.T) {
	t.Parallel()
	b := setupRelay(t)
	b.bindQueue("observer", "#")
	cfg := testRelayConfig()
	cfg.PollInterval = time.Hour
	relay := b.startRelay(cfg, b.amqpURL, nil)
	testenv.WaitFor(t, 10*time.Second, "the relay to connect", func() bool { return relay.Ready(b.ctx) == nil })
	time.Sleep(200 * time.Millisecond) // past the sweep that follows connecting

	ids := b.enqueue(1, messaging.Cause{})
	got := b.receive("observer", 1, 10*time.Second, 0)
	if got[0].MessageId != ids[0].String() {
		t.Fatalf("got %s", got[0].MessageId)
	}
}

// The database drops the relay's connections (its LISTEN connection, or
// in wal mode its replication connection, too): the relay reconnects,
// listens or streams again, and publishes what commits after.
func TestDatabaseConnectionsKilled(t *testing.T) {
	t.Parallel()
	b := setupRelay(t)
	b.bindQueue("observer", "#")
	cfg := testRelayConfig()
	cfg.PollInterval = time.Hour // only NOTIFY (and the sweep after re-LISTEN) can find rows
	relay := b.startRelay(cfg, b.amqpURL, nil)
	testenv.WaitFor(t, 10*time.Second, "the relay to connect", func() bool { return relay.Ready(b.ctx) == nil })
	b.enqueue(5, messaging.Cause{})
	b.receive("observer", 5, 10*time.Second, 0)

	var killed int
	err := b.pool.QueryRow(b.ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE datname = current_database() AND application_name LIKE $1 || '%'`, relayAppName).Scan(&killed)
	if err != nil || killed == 0 {
		t.Fatalf("terminated %d sessions: %v", killed, err)
	}
	time.Sleep(500 * time.Millisecond) // the LISTEN connection comes back
	b.enqueue(5, messaging.Cause{})
	b.receive("observer", 5, 20*time.Second, 0)
	testenv.WaitFor(t, 10*time.Second, "every row to be PUBLISHED", b.allPublished(10))
}
