package outboxtest

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
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
	"github.com/yourorg/orders/internal/messaging/outbox/internal/pipeline"
	"github.com/yourorg/orders/internal/testenv"
)

// Mode is a relay under test: the polling relay (Poll), or the
// log-tailing one (package wal makes its own Mode).
type Mode struct {
	Name string // poll or wal: some tests expect what only one of them does
	// NewDatabase makes a test's database, of outbox.Schema; nil:
	// testenv.NewDatabase.
	NewDatabase func(t testing.TB) *testenv.Database
	// Prepare, when set, readies a new bundle's database for the mode's
	// relays, before the test opens any transaction of its own.
	Prepare func(b *Bundle)
	// NewRelay makes a relay of the mode.
	NewRelay func(b *Bundle, cfg outbox.Config, deps messaging.Deps) (Relay, error)
	// pooled: the relays' pools go through PgBouncer (ThroughPgBouncer).
	pooled bool
}

// ThroughPgBouncer is m with the relays' pools going through PgBouncer in
// transaction mode, with the pooler's default settings
// (testenv.NewPgBouncer), in front of the test's database, and their
// LISTEN and replication connections past it: a relay deployed as
// docs/configuration.md#behind-a-connection-pooler says.
func (m Mode) ThroughPgBouncer() Mode {
	m.pooled = true
	return m
}

// Poll is the polling relay (outbox.Relay).
var Poll = Mode{Name: "poll", NewRelay: func(_ *Bundle, cfg outbox.Config, deps messaging.Deps) (Relay, error) {
	return outbox.NewRelay(cfg, deps)
}}

// Bundle is what a test of the relay works with: its own database and
// vhost, with the exchange declared, and relays of its mode.
type Bundle struct {
	T     testing.TB
	Mode  Mode
	Slot  string // a name unique to the test's database (the wal relays' replication slot)
	Ctx   context.Context
	Pool  *pgxpool.Pool // the test's own connections, straight to its database
	DBURL string        // the relays' pools' (through the pooler, if any)
	// DirectURL is the test's database past the pooler when the relays'
	// pools go through one (Mode.ThroughPgBouncer): the relays' LISTEN
	// and replication connections use it. "" without a pooler.
	DirectURL string
	AMQPURL   string
	Ch        *amqp.Channel
	Metrics   *testenv.Metrics // shared by the test's relays
	Logger    *slog.Logger     // the relays' logger; default testenv.Logger()
}

// Setup gives a test its own database and vhost, with the exchange
// declared, for relays of mode.
func Setup(t testing.TB, mode Mode) *Bundle {
	t.Helper()
	var db *testenv.Database
	if mode.NewDatabase != nil {
		db = mode.NewDatabase(t)
	} else {
		db = testenv.NewDatabase(t, outbox.Schema)
	}
	b := &Bundle{T: t, Mode: mode, Ctx: t.Context(), Pool: db.Pool, DBURL: db.URL, AMQPURL: testenv.NewVhost(t), Slot: "relay_" + db.Name}
	if mode.pooled {
		b.DirectURL = db.URL
		b.DBURL = testenv.NewPgBouncer(t, db.URL).URL(db.URL)
	}
	if mode.Prepare != nil {
		mode.Prepare(b)
	}
	b.Ch = testenv.NewChannel(t, b.AMQPURL)
	if err := messaging.DeclareExchange(b.Ch, Exchange); err != nil {
		t.Fatal(err)
	}
	b.Metrics = testenv.NewMetrics()
	return b
}

// BindQueue declares a quorum queue bound to the exchange with keys.
func (b *Bundle) BindQueue(name string, keys ...string) {
	b.T.Helper()
	if _, err := b.Ch.QueueDeclare(name, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		b.T.Fatal(err)
	}
	for _, k := range keys {
		if err := b.Ch.QueueBind(name, k, Exchange, false, nil); err != nil {
			b.T.Fatal(err)
		}
	}
}

// RelayAppName names the relays' database connections.
const RelayAppName = "outbox-relay-under-test"

// Writer writes the tests' messages, as order-api would.
var Writer = outbox.Writer{Producer: "test-producer", Exchange: Exchange, AggregateType: "test"}

// Config is fast: short polls, leases, timeouts and backoffs.
func Config() outbox.Config {
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

// RunningRelay is a relay StartRelay started.
type RunningRelay struct {
	Relay
	Stop func() error // cancels Run and returns what it returned
	Done chan struct{}
}

// Relay is a relay under test: an *outbox.Relay or a *wal.Relay.
type Relay interface {
	Run(ctx context.Context) error
	Ready(ctx context.Context) error
	ID() string
}

// PollOnly skips a test of what only the polling relay does (claims,
// leases, partitions) when the bundle's relays are another mode's.
func (b *Bundle) PollOnly(what string) {
	b.T.Helper()
	if b.Mode.Name != "poll" {
		b.T.Skipf("%s: tested in poll mode only (this run: %s)", what, b.Mode.Name)
	}
}

// StartRelay runs a relay until the test ends or Stop is called.
func (b *Bundle) StartRelay(cfg outbox.Config, amqpURL string, faults pipeline.Faults) *RunningRelay {
	b.T.Helper()
	// Each relay has a pool of its own, as in production, named so that a
	// test can find (and kill) its sessions.
	pool, err := database.NewPool(b.Ctx, database.PoolConfig{URL: b.DBURL, AppName: RelayAppName, AsyncCommit: true})
	if err != nil {
		b.T.Fatal(err)
	}
	b.T.Cleanup(pool.Close)
	if b.DirectURL != "" && cfg.ListenURL == "" {
		cfg.ListenURL = b.DirectURL // a NOTIFY dies in the pooler
	}
	cfg.Faults = faults
	deps := messaging.Deps{
		Pool: pool, AMQPURL: amqpURL, Logger: cmp.Or(b.Logger, testenv.Logger()),
		MeterProvider: b.Metrics.Provider,
	}
	r, err := b.Mode.NewRelay(b, cfg, deps)
	if err != nil {
		b.T.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	rr := &RunningRelay{Relay: r, Done: make(chan struct{})}
	var runErr error
	go func() {
		defer close(rr.Done)
		runErr = r.Run(ctx)
	}()
	rr.Stop = func() error {
		cancel()
		<-rr.Done
		return runErr
	}
	b.T.Cleanup(func() { _ = rr.Stop() })
	return rr
}

// Enqueue commits n order.cancelled messages, in transactions of up to 500.
func (b *Bundle) Enqueue(n int, cause messaging.Cause) []uuid.UUID {
	b.T.Helper()
	var ids []uuid.UUID
	for n > 0 {
		size := min(n, 500)
		msgs := make([]messaging.Message, size)
		for i := range msgs {
			msgs[i] = Message{Type: TypeCancelled, ID: uuid.Must(uuid.NewV7())}
		}
		err := pgx.BeginFunc(b.Ctx, b.Pool, func(tx pgx.Tx) error {
			got, err := Writer.Write(b.Ctx, tx, cause, msgs...)
			ids = append(ids, got...)
			return err
		})
		if err != nil {
			b.T.Fatal(err)
		}
		n -= size
	}
	return ids
}

// Receive consumes queue until want messages arrived (or timeout) and
// returns them. It keeps listening for quiet a moment longer, to catch
// duplicates. It acknowledges only what it returns: a message the broker
// pushed past that goes back on the queue when Receive closes its channel.
func (b *Bundle) Receive(queue string, want int, timeout, quiet time.Duration) []amqp.Delivery {
	b.T.Helper()
	conn, err := amqp.Dial(b.AMQPURL)
	if err != nil {
		b.T.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		b.T.Fatal(err)
	}
	deliveries, err := ch.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		b.T.Fatal(err)
	}
	var got []amqp.Delivery
	take := func(d amqp.Delivery) {
		if err := d.Ack(false); err != nil {
			b.T.Fatal(err)
		}
		got = append(got, d)
	}
	deadline := time.After(timeout)
	for len(got) < want {
		select {
		case d := <-deliveries:
			take(d)
		case <-deadline:
			ids := make([]string, 0, 20)
			for _, d := range got[:min(len(got), cap(ids))] {
				ids = append(ids, d.MessageId+" ("+d.RoutingKey+")")
			}
			b.T.Fatalf("received %d of %d messages from %s, first %v; the outbox rows not PUBLISHED: %s", len(got), want, queue, ids, b.unpublished())
		}
	}
	for {
		select {
		case d := <-deliveries:
			take(d)
		case <-time.After(quiet):
			return got
		}
	}
}

// unpublished describes the outbox rows not PUBLISHED, for a failure
// message: what a relay still owes, and why.
func (b *Bundle) unpublished() string {
	rows, err := b.Pool.Query(context.Background(), `SELECT outbox_id, message_type, status, attempt_count,
		extract(epoch FROM next_attempt_at - now())::float8, coalesce(last_error, '') FROM message_outbox WHERE status <> 'PUBLISHED' ORDER BY created_at`)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var id uuid.UUID
		var typ, status, lastErr string
		var attempts int
		var retryIn float64
		if err := rows.Scan(&id, &typ, &status, &attempts, &retryIn, &lastErr); err != nil {
			return "(" + err.Error() + ")"
		}
		out = append(out, fmt.Sprintf("%s %s %s attempts=%d retry_in=%.1fs last_error=%q", id, typ, status, attempts, retryIn, lastErr))
	}
	if err := rows.Err(); err != nil {
		return "(" + err.Error() + ")"
	}
	if len(out) == 0 {
		return "none"
	}
	return strings.Join(out, "; ")
}

func (b *Bundle) StatusCounts() map[string]int {
	b.T.Helper()
	rows, err := b.Pool.Query(b.Ctx, "SELECT status, count(*) FROM message_outbox GROUP BY status")
	if err != nil {
		b.T.Fatal(err)
	}
	counts := map[string]int{}
	for rows.Next() {
		var s string
		var n int
		if err := rows.Scan(&s, &n); err != nil {
			b.T.Fatal(err)
		}
		counts[s] = n
	}
	return counts
}

func (b *Bundle) AllPublished(n int) func() bool {
	return func() bool { return b.StatusCounts()["PUBLISHED"] == n }
}

func (b *Bundle) Counter(name string) int64 {
	b.T.Helper()
	return b.Metrics.Counter(b.T, name)
}

func (b *Bundle) CounterWith(name, key, value string) int64 {
	b.T.Helper()
	return b.Metrics.CounterWith(b.T, name, key, value)
}

// The message carries the envelope (docs/messaging.md), and its row ends
// PUBLISHED.
func testRelayPublishesTheEnvelope(t *testing.T, mode Mode) {
	t.Parallel()
	b := Setup(t, mode)
	b.BindQueue("observer", "#")
	ids := b.Enqueue(1, messaging.Cause{CorrelationID: "corr-1", MessageID: "cause-1"})
	b.StartRelay(Config(), b.AMQPURL, nil)

	d := b.Receive("observer", 1, 10*time.Second, 0)[0]
	if d.MessageId != ids[0].String() || d.Type != TypeCancelled || d.ContentType != "application/json" ||
		d.DeliveryMode != amqp.Persistent || d.CorrelationId != "corr-1" || d.AppId != "test-producer" ||
		d.Exchange != Exchange || d.RoutingKey != TypeCancelled || d.Timestamp.IsZero() {
		t.Fatalf("envelope: %+v", d)
	}
	if d.Headers[messaging.HeaderMessageVersion] != int32(1) || d.Headers["causation_id"] != "cause-1" || d.Headers["correlation_id"] != "corr-1" {
		t.Fatalf("headers: %v", d.Headers)
	}
	if _, leaked := d.Headers["app_id"]; leaked {
		t.Fatalf("app_id travels as a property, not a header: %v", d.Headers)
	}
	var body Message
	if err := json.Unmarshal(d.Body, &body); err != nil || body.ID == uuid.Nil {
		t.Fatalf("body %s: %v", d.Body, err)
	}
	testenv.WaitFor(t, 5*time.Second, "the row to be PUBLISHED", b.AllPublished(1))
	var publishedAt *time.Time
	var claimedBy *string
	if err := b.Pool.QueryRow(b.Ctx, "SELECT published_at, claimed_by FROM message_outbox").Scan(&publishedAt, &claimedBy); err != nil || publishedAt == nil || claimedBy != nil {
		t.Fatalf("published_at %v claimed_by %v: %v", publishedAt, claimedBy, err)
	}
	if got := b.Counter("outbox.published"); got != 1 {
		t.Fatalf("outbox.published = %d", got)
	}
}

// Three relays over 2,000 rows: every row ends PUBLISHED and reaches the
// queue at least once; no row is ever claimed by two relays at once (every
// row was claimed exactly once: attempt_count 1, and each claim was marked
// by one relay only).
func testThreeRelaysShareTheBacklog(t *testing.T, mode Mode) {
	t.Parallel()
	b := Setup(t, mode)
	b.BindQueue("observer", "#")
	const rows = 2000
	ids := b.Enqueue(rows, messaging.Cause{})

	var mu sync.Mutex
	markedBy := map[uuid.UUID][]string{}
	hook := func(name string) pipeline.Faults {
		return BeforeMark(func(claims []pipeline.Claim) error {
			mu.Lock()
			defer mu.Unlock()
			for _, c := range claims {
				markedBy[c.ID] = append(markedBy[c.ID], fmt.Sprintf("%s#%d", name, c.Attempt))
			}
			return nil
		})
	}
	for i := range 3 {
		cfg := Config()
		cfg.BatchSize = 50 // small batches, so that the relays interleave
		b.StartRelay(cfg, b.AMQPURL, hook(fmt.Sprint("relay-", i)))
	}
	testenv.WaitFor(t, 60*time.Second, "every row to be PUBLISHED", b.AllPublished(rows))

	got := b.Receive("observer", rows, 30*time.Second, 500*time.Millisecond)
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
	if err := b.Pool.QueryRow(b.Ctx, "SELECT max(attempt_count) FROM message_outbox").Scan(&maxAttempt); err != nil || maxAttempt != 1 {
		t.Fatalf("max attempt_count = %d (%v): a row was claimed twice", maxAttempt, err)
	}
	t.Logf("%d rows, %d deliveries, %d duplicates; rows per relay: %v", rows, len(got), duplicates, perRelay)
}

// A crash after the broker's confirm and before the database mark: the row
// stays PUBLISHING, comes back when the lease ends, and is published again
// with the same message_id.
func testCrashBetweenConfirmAndMarkRepublishesSameMessageID(t *testing.T, mode Mode) {
	t.Parallel()
	b := Setup(t, mode)
	b.BindQueue("observer", "#")
	ids := b.Enqueue(3, messaging.Cause{})

	cfg := Config()
	cfg.Lease = 3 * time.Second
	// The crash waits until all three are out: the log stream marks what
	// the broker confirmed as it comes, and a crash at its first mark could
	// come before it has published the third row at all.
	out := make(chan struct{})
	crashed := b.StartRelay(cfg, b.AMQPURL, BeforeMark(func([]pipeline.Claim) error {
		select {
		case <-out:
		case <-time.After(30 * time.Second):
		}
		return errors.New("injected crash")
	}))
	first := b.Receive("observer", 3, 10*time.Second, 0)
	close(out)
	select {
	case <-crashed.Done:
	case <-time.After(30 * time.Second):
		t.Fatal("the relay did not end within 30s of its injected crash")
	}
	if err := crashed.Stop(); err == nil || !strings.Contains(err.Error(), "injected crash") {
		t.Fatalf("crashed relay returned %v", err)
	}
	// The polling relay's rows wait for their lease; the log stream's were
	// never written back, and the slot streams them again.
	if want := map[string]string{"poll": "PUBLISHING", "wal": "PENDING"}[mode.Name]; b.StatusCounts()[want] != 3 {
		t.Fatalf("after the crash: %v, want 3 %s", b.StatusCounts(), want)
	}

	b.StartRelay(Config(), b.AMQPURL, nil)
	second := b.Receive("observer", 3, 20*time.Second, 0)
	testenv.WaitFor(t, 10*time.Second, "the rows to be PUBLISHED", b.AllPublished(3))

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
	if mode.Name == "wal" {
		return
	}
	// Recovered after the crashed relay's lease, the attempt it claimed
	// given back: only the second relay's counts.
	var attempts int
	_ = b.Pool.QueryRow(b.Ctx, "SELECT min(attempt_count) FROM message_outbox").Scan(&attempts)
	if got := b.Counter("outbox.lease.recovered"); attempts != 1 || got != 3 {
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
func testUnroutableMessageEndsFailedWhileOthersFlow(t *testing.T, mode Mode) {
	t.Parallel()
	b := Setup(t, mode)
	b.BindQueue("cancelled-only", TypeCancelled)
	good := b.Enqueue(20, messaging.Cause{})
	var unroutable uuid.UUID
	err := pgx.BeginFunc(b.Ctx, b.Pool, func(tx pgx.Tx) error {
		ids, err := Writer.Write(b.Ctx, tx, messaging.Cause{}, Message{Type: TypeFulfilled, ID: uuid.New()})
		unroutable = ids[0]
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	more := b.Enqueue(20, messaging.Cause{})

	cfg := Config()
	cfg.MaxAttempts = 3
	b.StartRelay(cfg, b.AMQPURL, nil)

	got := b.Receive("cancelled-only", len(good)+len(more), 10*time.Second, 0)
	if len(got) != 40 {
		t.Fatalf("received %d", len(got))
	}
	var status, lastError string
	var attempts int
	testenv.WaitFor(t, 10*time.Second, "the unroutable row to be FAILED", func() bool {
		_ = b.Pool.QueryRow(b.Ctx, "SELECT status, coalesce(last_error, ''), attempt_count FROM message_outbox WHERE outbox_id = $1", unroutable).
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
		counts = b.StatusCounts()
		return counts["PUBLISHED"] == 40
	})
	if counts["FAILED"] != 1 || len(counts) != 2 {
		t.Fatalf("status counts %v, want 40 PUBLISHED and 1 FAILED", counts)
	}
	if got := b.Counter("outbox.unroutable"); got != 3 {
		t.Fatalf("outbox.unroutable = %d, want 3", got)
	}
}

// The broker goes away (the connection is cut) while rows are pending:
// nothing is marked, and everything is published once it is back.
func testBrokerDownNothingMarkedEverythingPublishedAfter(t *testing.T, mode Mode) {
	t.Parallel()
	b := Setup(t, mode)
	b.BindQueue("observer", "#")
	proxy := testenv.NewProxy(t, testenv.HostPort(b.AMQPURL))
	relay := b.StartRelay(Config(), proxy.Rewrite(b.AMQPURL), nil)
	testenv.WaitFor(t, 10*time.Second, "the relay to connect", func() bool { return relay.Ready(b.Ctx) == nil })

	proxy.Cut()
	testenv.WaitFor(t, 10*time.Second, "the relay to notice", func() bool { return relay.Ready(b.Ctx) != nil })
	ids := b.Enqueue(300, messaging.Cause{})
	time.Sleep(time.Second) // the relay keeps trying to reconnect meanwhile
	if c := b.StatusCounts(); c["PENDING"] != len(ids) {
		t.Fatalf("while the broker is down: %v, want all %d PENDING", c, len(ids))
	}

	proxy.Restore()
	testenv.WaitFor(t, 30*time.Second, "every row to be PUBLISHED", b.AllPublished(len(ids)))
	got := b.Receive("observer", len(ids), 10*time.Second, 0)
	if len(messageIDSet(got)) != len(ids) {
		t.Fatalf("received %d distinct of %d", len(messageIDSet(got)), len(ids))
	}
}

// The connection drops in the middle of a backlog: whatever was in flight
// is retried, and every row reaches the queue at least once.
func testConnectionLostMidBacklog(t *testing.T, mode Mode) {
	t.Parallel()
	b := Setup(t, mode)
	b.BindQueue("observer", "#")
	proxy := testenv.NewProxy(t, testenv.HostPort(b.AMQPURL))
	ids := b.Enqueue(3000, messaging.Cause{})
	b.StartRelay(Config(), proxy.Rewrite(b.AMQPURL), nil)

	testenv.WaitFor(t, 30*time.Second, "some rows to be published", func() bool { return b.StatusCounts()["PUBLISHED"] > 300 })
	proxy.Cut()
	time.Sleep(300 * time.Millisecond)
	proxy.Restore()

	testenv.WaitFor(t, 60*time.Second, "every row to be PUBLISHED", b.AllPublished(len(ids)))
	got := b.Receive("observer", len(ids), 30*time.Second, 500*time.Millisecond)
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
func testConfirmTimeoutRetries(t *testing.T, mode Mode) {
	t.Parallel()
	b := Setup(t, mode)
	b.BindQueue("observer", "#")
	proxy := testenv.NewProxy(t, testenv.HostPort(b.AMQPURL))
	relay := b.StartRelay(Config(), proxy.Rewrite(b.AMQPURL), nil)
	testenv.WaitFor(t, 10*time.Second, "the relay to connect", func() bool { return relay.Ready(b.Ctx) == nil })

	proxy.Stall()
	b.Enqueue(10, messaging.Cause{})
	var lastError string
	testenv.WaitFor(t, 15*time.Second, "a confirm timeout to be recorded", func() bool {
		if mode.Name == "wal" { // the log stream writes nothing back: it streams the rows again
			return b.CounterWith("outbox.publish.attempts", "outcome", "timeout") >= 1
		}
		_ = b.Pool.QueryRow(b.Ctx, "SELECT coalesce(max(last_error), '') FROM message_outbox").Scan(&lastError)
		return strings.Contains(lastError, "no publisher confirm")
	})
	proxy.Heal()
	testenv.WaitFor(t, 30*time.Second, "every row to be PUBLISHED", b.AllPublished(10))
	if got := messageIDSet(b.Receive("observer", 10, 10*time.Second, 0)); len(got) != 10 {
		t.Fatalf("received %d distinct", len(got))
	}
}

// On shutdown the relay stops claiming, waits for outstanding confirms up to
// its deadline, and hands the unconfirmed rows back (PENDING, attempt not
// counted) for the next relay.
func testShutdownHandsBackUnconfirmedRows(t *testing.T, mode Mode) {
	t.Parallel()
	b := Setup(t, mode)
	b.BindQueue("observer", "#")
	proxy := testenv.NewProxy(t, testenv.HostPort(b.AMQPURL))
	cfg := Config()
	cfg.ConfirmTimeout = 4 * time.Second
	cfg.ShutdownTimeout = 500 * time.Millisecond
	relay := b.StartRelay(cfg, proxy.Rewrite(b.AMQPURL), nil)
	testenv.WaitFor(t, 10*time.Second, "the relay to connect", func() bool { return relay.Ready(b.Ctx) == nil })

	proxy.Stall() // publishes go out, confirms never come back
	b.Enqueue(5, messaging.Cause{})
	testenv.WaitFor(t, 5*time.Second, "the rows to be published", func() bool {
		if mode.Name == "wal" { // the log stream claims nothing: the rows stay PENDING
			return b.Metrics.Gauge(t, "relay.in_flight") == 5
		}
		return b.StatusCounts()["PUBLISHING"] == 5
	})
	if err := relay.Stop(); err != nil {
		t.Fatal(err)
	}
	var maxAttempt int
	_ = b.Pool.QueryRow(b.Ctx, "SELECT max(attempt_count) FROM message_outbox").Scan(&maxAttempt)
	if c := b.StatusCounts(); c["PENDING"] != 5 || maxAttempt != 0 {
		t.Fatalf("after shutdown: %v, max attempt %d; want 5 PENDING, attempts not counted", c, maxAttempt)
	}
	proxy.Heal()
	b.StartRelay(Config(), b.AMQPURL, nil)
	testenv.WaitFor(t, 10*time.Second, "every row to be PUBLISHED", b.AllPublished(5))
}

// Rows committed out of order, a long-open transaction holding an outbox
// row, and a rolled-back transaction: every committed row is published,
// the rolled-back one never.
func testCommitOrderAndRollbacks(t *testing.T, mode Mode) {
	t.Parallel()
	b := Setup(t, mode)
	b.BindQueue("observer", "#")
	b.StartRelay(Config(), b.AMQPURL, nil)

	enqueueIn := func(tx pgx.Tx) uuid.UUID {
		ids, err := Writer.Write(b.Ctx, tx, messaging.Cause{}, Message{Type: TypeCancelled, ID: uuid.New()})
		if err != nil {
			t.Fatal(err)
		}
		return ids[0]
	}
	// The long transaction writes first (older created_at and id) and
	// stays open.
	long, err := b.Pool.Begin(b.Ctx)
	if err != nil {
		t.Fatal(err)
	}
	older := enqueueIn(long)
	// A later transaction commits first.
	var newer uuid.UUID
	if err := pgx.BeginFunc(b.Ctx, b.Pool, func(tx pgx.Tx) error { newer = enqueueIn(tx); return nil }); err != nil {
		t.Fatal(err)
	}
	// One more rolls back.
	rolledBack, err := b.Pool.Begin(b.Ctx)
	if err != nil {
		t.Fatal(err)
	}
	ghost := enqueueIn(rolledBack)
	if err := rolledBack.Rollback(b.Ctx); err != nil {
		t.Fatal(err)
	}

	first := b.Receive("observer", 1, 10*time.Second, 300*time.Millisecond)
	if len(first) != 1 || first[0].MessageId != newer.String() {
		t.Fatalf("while the long transaction is open: %v", messageIDs(first))
	}
	if err := long.Commit(b.Ctx); err != nil {
		t.Fatal(err)
	}
	second := b.Receive("observer", 1, 10*time.Second, 500*time.Millisecond)
	if len(second) != 1 || second[0].MessageId != older.String() {
		t.Fatalf("after the long transaction commits: %v", messageIDs(second))
	}
	testenv.WaitFor(t, 5*time.Second, "both rows to be PUBLISHED", b.AllPublished(2))
	var n int
	_ = b.Pool.QueryRow(b.Ctx, "SELECT count(*) FROM message_outbox WHERE outbox_id = $1", ghost).Scan(&n)
	if n != 0 {
		t.Fatal("the rolled-back row exists")
	}
}

// A committed row is published on its NOTIFY, long before the poll (set to
// an hour here) would find it.
func testNotifyWakesTheRelay(t *testing.T, mode Mode) {
	t.Parallel()
	b := Setup(t, mode)
	b.BindQueue("observer", "#")
	cfg := Config()
	cfg.PollInterval = time.Hour
	relay := b.StartRelay(cfg, b.AMQPURL, nil)
	testenv.WaitFor(t, 10*time.Second, "the relay to connect", func() bool { return relay.Ready(b.Ctx) == nil })
	time.Sleep(200 * time.Millisecond) // past the sweep that follows connecting

	ids := b.Enqueue(1, messaging.Cause{})
	got := b.Receive("observer", 1, 10*time.Second, 0)
	if got[0].MessageId != ids[0].String() {
		t.Fatalf("got %s", got[0].MessageId)
	}
}

// The database drops the relay's connections (its LISTEN connection, or
// in wal mode its replication connection, too): the relay reconnects,
// listens or streams again, and publishes what commits after. Behind a
// pooler its pool's sessions are the pooler's server connections to the
// test's database, and those are what the database drops.
func testDatabaseConnectionsKilled(t *testing.T, mode Mode) {
	t.Parallel()
	b := Setup(t, mode)
	b.BindQueue("observer", "#")
	cfg := Config()
	cfg.PollInterval = time.Hour // only NOTIFY (and the sweep after re-LISTEN) can find rows
	relay := b.StartRelay(cfg, b.AMQPURL, nil)
	testenv.WaitFor(t, 10*time.Second, "the relay to connect", func() bool { return relay.Ready(b.Ctx) == nil })
	b.Enqueue(5, messaging.Cause{})
	b.Receive("observer", 5, 10*time.Second, 0)

	// The relay's sessions are those of the test's database named after
	// it: its own, and behind a pooler the pooler's server connections,
	// which PgBouncer names after the client it lends each to (it sets
	// the client's application_name on it). The test's own sessions, and
	// the pooler's to other databases (other tests'), are left alone. At
	// least two: one of the pool's, and the LISTEN or replication
	// connection.
	var killed int
	err := b.Pool.QueryRow(b.Ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE datname = current_database() AND application_name LIKE $1 || '%'`, RelayAppName).Scan(&killed)
	if err != nil || killed < 2 {
		t.Fatalf("terminated %d sessions (%v); want the pool's and the LISTEN or replication connection", killed, err)
	}
	t.Logf("terminated the relay's %d sessions", killed)
	time.Sleep(500 * time.Millisecond) // the LISTEN connection comes back
	b.Enqueue(5, messaging.Cause{})
	b.Receive("observer", 5, 20*time.Second, 0)
	testenv.WaitFor(t, 10*time.Second, "every row to be PUBLISHED", b.AllPublished(10))
}

// BeforeMark is an pipeline.Faults whose BeforeMark calls the function.
type BeforeMark func([]pipeline.Claim) error

// BeforeMark calls f.
func (f BeforeMark) BeforeMark(published []pipeline.Claim) error { return f(published) }

// AfterClaim does nothing.
func (BeforeMark) AfterClaim(int) error { return nil }

// AfterClaim is a pipeline.Faults whose AfterClaim calls the function.
type AfterClaim func(rows int) error

// BeforeMark does nothing.
func (AfterClaim) BeforeMark([]pipeline.Claim) error { return nil }

// AfterClaim calls f.
func (f AfterClaim) AfterClaim(rows int) error { return f(rows) }
