package wal_test

import (
	"bytes"
	"context"
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

	"github.com/yourorg/orders/internal/messaging"
	"github.com/yourorg/orders/internal/messaging/outbox"
	"github.com/yourorg/orders/internal/messaging/outbox/outboxtest"
	"github.com/yourorg/orders/internal/messaging/outbox/wal"
	"github.com/yourorg/orders/internal/testenv"
)

// The tests of the log-tailing relay's own traps. The relay suite runs
// against it too (TestRelay). They need a PostgreSQL with
// wal_level=logical, which the test binary starts: they run with
// OUTBOX_TEST_RELAY_MODE=wal (make test/wal) only, except the first.

// A server that cannot stream (the shared one runs wal_level=replica) is
// an error at once that says what to change.
func TestWALStartFailsClearly(t *testing.T) {
	t.Parallel()
	db := testenv.NewDatabase(t, outbox.Schema)
	var level string
	if err := db.Pool.QueryRow(t.Context(), "SHOW wal_level").Scan(&level); err != nil || level == "logical" {
		t.Skipf("the test server runs wal_level=%s (%v): this test needs one that cannot stream", level, err)
	}
	deps := messaging.Deps{Pool: db.Pool, AMQPURL: testenv.NewVhost(t), Logger: testenv.Logger(), MeterProvider: testenv.NewMetrics().Provider}
	r, err := wal.NewRelay(outboxtest.Config(), wal.Config{Slot: "never_created"}, deps)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	err = r.Run(ctx)
	if err == nil || !strings.Contains(err.Error(), "wal_level=logical") || !strings.Contains(err.Error(), "RELAY_MODE=poll") {
		t.Fatalf("Run on a wal_level=%s server returned %v; want an error naming wal_level=logical and RELAY_MODE=poll", level, err)
	}

}

// slotPosition is the slot's confirmed position.
func slotPosition(b *outboxtest.Bundle) uint64 {
	b.T.Helper()
	var lsn uint64
	err := b.Pool.QueryRow(b.Ctx, `SELECT coalesce(pg_wal_lsn_diff(confirmed_flush_lsn, '0/0'), 0)::bigint
		FROM pg_replication_slots WHERE slot_name = $1`, b.Slot).Scan(&lsn)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		b.T.Fatal(err)
	}
	return lsn
}

// A relay started again resumes from the slot's confirmed position: what
// committed while no relay ran is published, what was published before is
// not published again.
func TestWALResumesFromTheSlot(t *testing.T) {
	t.Parallel()
	b := setupRelay(t)
	b.BindQueue("observer", "#")
	first := b.StartRelay(outboxtest.Config(), b.AMQPURL, nil)
	testenv.WaitFor(t, 10*time.Second, "the relay to stream", func() bool { return first.Ready(b.Ctx) == nil })
	b.Enqueue(50, messaging.Cause{})
	b.Receive("observer", 50, 20*time.Second, 0)
	testenv.WaitFor(t, 10*time.Second, "the rows to be PUBLISHED", b.AllPublished(50))
	if err := first.Stop(); err != nil {
		t.Fatal(err)
	}
	before := slotPosition(b)
	if before == 0 {
		t.Fatal("the slot has no confirmed position after a clean stop")
	}

	// A queue of its own for the second relay: the first one may have
	// published some of its rows twice (a confirm that came after
	// ConfirmTimeout on a busy machine ends a session, and the slot streams
	// the rest again), and those copies wait in "observer".
	b.BindQueue("second", "#")
	later := b.Enqueue(30, messaging.Cause{})
	b.StartRelay(outboxtest.Config(), b.AMQPURL, nil)
	// The slot streams in log order, so a row of the first relay's streamed
	// again would arrive before the last of the 30.
	got := b.ReceiveEach("second", later, 20*time.Second)
	want := map[string]bool{}
	for _, id := range later {
		want[id.String()] = true
	}
	again := 0
	for _, d := range got {
		if !want[d.MessageId] {
			again++
		}
	}
	if again > 0 {
		t.Fatalf("the second relay published %d of the first relay's messages again (and %d copies of the 30 written while none ran): "+
			"it did not resume from the slot's position", again, len(got)-again)
	}
	testenv.WaitFor(t, 10*time.Second, "every row to be PUBLISHED", b.AllPublished(80))
	testenv.WaitFor(t, 10*time.Second, "the slot to move on", func() bool { return slotPosition(b) > before })
}

// Only one relay streams the slot; the other stands by, ready, and takes
// over when the first one goes.
func TestWALStandbyTakesOver(t *testing.T) {
	t.Parallel()
	b := setupRelay(t)
	b.BindQueue("observer", "#")
	a := b.StartRelay(outboxtest.Config(), b.AMQPURL, nil)
	testenv.WaitFor(t, 10*time.Second, "the first relay to stream", func() bool { return streaming(a) })
	c := b.StartRelay(outboxtest.Config(), b.AMQPURL, nil)
	testenv.WaitFor(t, 10*time.Second, "the second relay to stand by, ready", func() bool { return c.Ready(b.Ctx) == nil })
	if streaming(c) {
		t.Fatal("two relays stream one slot")
	}
	b.Enqueue(20, messaging.Cause{})
	b.Receive("observer", 20, 20*time.Second, 0)

	if err := a.Stop(); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 15*time.Second, "the standby to take over", func() bool { return streaming(c) })
	b.Enqueue(20, messaging.Cause{})
	b.Receive("observer", 20, 20*time.Second, 0)
	testenv.WaitFor(t, 10*time.Second, "every row to be PUBLISHED", b.AllPublished(40))
}

func streaming(r *outboxtest.RunningRelay) bool {
	w, ok := r.Relay.(*wal.Relay)
	return ok && w.Streaming()
}

// A slot dropped while no relay ran (or lost) takes with it the position
// of the rows committed since: the relay makes a new slot, and publishes
// the rows still PENDING before it first. Nothing is lost.
func TestWALSlotLostFallsBackToTheRows(t *testing.T) {
	t.Parallel()
	b := setupRelay(t)
	b.BindQueue("observer", "#")
	first := b.StartRelay(outboxtest.Config(), b.AMQPURL, nil)
	testenv.WaitFor(t, 10*time.Second, "the relay to stream", func() bool { return streaming(first) })
	if err := first.Stop(); err != nil {
		t.Fatal(err)
	}
	missed := b.Enqueue(25, messaging.Cause{})
	dropSlot(t, b.Pool, b.Slot)

	b.StartRelay(outboxtest.Config(), b.AMQPURL, nil)
	time.Sleep(500 * time.Millisecond)
	streamed := b.Enqueue(25, messaging.Cause{})
	got := b.Receive("observer", 50, 30*time.Second, 500*time.Millisecond)
	seen := map[string]bool{}
	for _, d := range got {
		seen[d.MessageId] = true
	}
	for _, id := range append(missed, streamed...) {
		if !seen[id.String()] {
			t.Fatalf("message %s never published", id)
		}
	}
	testenv.WaitFor(t, 10*time.Second, "every row to be PUBLISHED", b.AllPublished(50))
	// At a start, a slot is expected when rows wait before it.
	if n, rows := b.Counter("relay.wal.slot.missing"), b.Counter("relay.wal.slot.missing.rows"); n != 1 || rows != int64(len(missed)) {
		t.Fatalf("relay.wal.slot.missing = %d with %d rows; want 1 with the %d rows written while no relay ran", n, rows, len(missed))
	}
}

// A slot dropped under a running relay is an error in the log and the
// metrics, with the rows it left behind, and those rows go out at once,
// ahead of the new slot's stream (an aggregate's earlier row first), not
// SweepAfter later. A transaction that holds an xid, open while the slot
// goes, holds the new slot back until it commits; so every row below is
// committed while no slot exists, and the count is exact.
func TestWALSlotDroppedUnderTheRelay(t *testing.T) {
	t.Parallel()
	b := setupRelay(t)
	logs := &lockedBuffer{}
	b.Logger = slog.New(slog.NewTextHandler(logs, nil))
	const sweepAfter = 3 * time.Minute // far beyond the waits below, on a loaded machine too
	b.Mode.NewRelay = func(b *outboxtest.Bundle, cfg outbox.Config, deps messaging.Deps) (outboxtest.Relay, error) {
		wc := testWALConfig(b)
		wc.SweepAfter = sweepAfter
		return wal.NewRelay(cfg, wc, deps)
	}
	b.BindQueue("observer", "#")
	r := b.StartRelay(outboxtest.Config(), b.AMQPURL, nil)
	testenv.WaitFor(t, 10*time.Second, "the relay to stream", func() bool { return streaming(r) })
	b.Enqueue(10, messaging.Cause{})
	b.Receive("observer", 10, 20*time.Second, 0)
	testenv.WaitFor(t, 10*time.Second, "the first rows to be PUBLISHED", b.AllPublished(10))

	write := func(tx pgx.Tx, typ string, aggregate uuid.UUID) uuid.UUID {
		t.Helper()
		ids, err := outboxtest.Writer.Write(b.Ctx, tx, messaging.Cause{}, outboxtest.Message{Type: typ, ID: aggregate})
		if err != nil {
			t.Fatal(err)
		}
		return ids[0]
	}
	commit := func(typ string, aggregate uuid.UUID) uuid.UUID {
		t.Helper()
		var id uuid.UUID
		if err := pgx.BeginFunc(b.Ctx, b.Pool, func(tx pgx.Tx) error { id = write(tx, typ, aggregate); return nil }); err != nil {
			t.Fatal(err)
		}
		return id
	}
	open, err := b.Pool.Begin(b.Ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = open.Rollback(context.Background()) }()
	before := []uuid.UUID{write(open, outboxtest.TypeSubmitted, uuid.New())}

	dropSlot(t, b.Pool, b.Slot)
	aggregates := make([]uuid.UUID, 20)
	for i := range aggregates {
		aggregates[i] = uuid.New()
		before = append(before, commit(outboxtest.TypeSubmitted, aggregates[i]))
	}
	testenv.WaitFor(t, 45*time.Second, "the relay to make a new slot, held back by the open transaction", func() bool {
		var n int
		err := b.Pool.QueryRow(b.Ctx, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1", b.Slot).Scan(&n)
		return err == nil && n == 1
	})
	if err := open.Commit(b.Ctx); err != nil {
		t.Fatal(err)
	}
	committed := time.Now()
	testenv.WaitFor(t, 45*time.Second, "the relay to stream the new slot", func() bool { return streaming(r) })
	var after []uuid.UUID
	for _, a := range aggregates {
		after = append(after, commit(outboxtest.TypeCancelled, a))
	}

	// Well under SweepAfter: the rows written while no slot existed do not
	// wait for the sweep.
	got := b.ReceiveEach("observer", append(slices.Clone(before), after...), time.Minute)
	if took := time.Since(committed); took > sweepAfter/3 {
		t.Fatalf("the rows written while no slot existed took %s to go out; want well under RELAY_WAL_SWEEP_AFTER (%s)", took, sweepAfter)
	}
	first := map[string]int{}
	for i, d := range got {
		if _, ok := first[d.MessageId]; !ok {
			first[d.MessageId] = i
		}
	}
	for i, a := range aggregates {
		if first[before[i+1].String()] > first[after[i].String()] {
			t.Fatalf("aggregate %s: the row the new slot streamed went out before the one written while no slot existed", a)
		}
	}
	if n := b.Counter("relay.wal.slot.missing"); n != 1 {
		t.Fatalf("relay.wal.slot.missing = %d, want 1", n)
	}
	if n := b.Counter("relay.wal.slot.missing.rows"); n != int64(len(before)) {
		t.Fatalf("relay.wal.slot.missing.rows = %d, want the %d rows committed while no slot existed", n, len(before))
	}
	line := ""
	for l := range strings.Lines(logs.String()) {
		if strings.Contains(l, "replication slot missing") {
			line = l
		}
	}
	if !strings.Contains(line, "level=ERROR") || !strings.Contains(line, "slot="+b.Slot) || !strings.Contains(line, fmt.Sprintf("rows=%d", len(before))) {
		t.Fatalf("the log says %q; want an ERROR naming slot %s and its %d rows", line, b.Slot, len(before))
	}
	testenv.WaitFor(t, 10*time.Second, "every row to be PUBLISHED", b.AllPublished(10+len(before)+len(after)))
}

// lockedBuffer is a log sink that a test reads while the relay writes.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
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

// With the outbox quiet and the rest of the database busy, the heartbeat
// moves the slot on: it does not keep WAL without bound.
func TestWALHeartbeatMovesAQuietSlot(t *testing.T) {
	t.Parallel()
	b := setupRelay(t)
	r := b.StartRelay(outboxtest.Config(), b.AMQPURL, nil)
	testenv.WaitFor(t, 10*time.Second, "the relay to stream", func() bool { return streaming(r) })
	if _, err := b.Pool.Exec(b.Ctx, `CREATE TABLE busy (n int, pad text);
		INSERT INTO busy SELECT g, repeat('x', 200) FROM generate_series(1, 20000) g`); err != nil {
		t.Fatal(err)
	}
	var written uint64
	if err := b.Pool.QueryRow(b.Ctx, "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint").Scan(&written); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "the slot to move past the other table's WAL", func() bool { return slotPosition(b) >= written })
	// The gauge measures from the server's current WAL position, which the
	// other tests on this server move too: wait for a moment it is small.
	testenv.WaitFor(t, 15*time.Second, "relay.wal.slot.lag under 1 MiB once the slot moved on", func() bool {
		return b.Metrics.Gauge(t, "relay.wal.slot.lag") <= 1<<20
	})
}

// A transaction far larger than logical_decoding_work_mem (the test
// server's is 64kB: the server spills it to disk) comes out whole, at its
// commit; a transaction that dies before its commit never comes out.
func TestWALLargeAndAbortedTransactions(t *testing.T) {
	t.Parallel()
	b := setupRelay(t)
	b.BindQueue("observer", "#")
	b.StartRelay(outboxtest.Config(), b.AMQPURL, nil)

	// A transaction whose session is killed before it commits.
	conn, err := pgx.Connect(b.Ctx, b.DBURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	tx, err := conn.Begin(b.Ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := outboxtest.Writer.Write(b.Ctx, tx, messaging.Cause{}, outboxtest.Message{Type: outboxtest.TypeCancelled, ID: uuid.Must(uuid.NewV7())}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Pool.Exec(b.Ctx, "SELECT pg_terminate_backend($1)", conn.PgConn().PID()); err != nil {
		t.Fatal(err)
	}

	const large = 3000
	msgs := make([]messaging.Message, large)
	for i := range msgs {
		msgs[i] = outboxtest.Message{Type: outboxtest.TypeCancelled, ID: uuid.Must(uuid.NewV7())}
	}
	err = pgx.BeginFunc(b.Ctx, b.Pool, func(tx pgx.Tx) error {
		for i := 0; i < large; i += 100 { // many statements: one transaction
			if _, err := outboxtest.Writer.Write(b.Ctx, tx, messaging.Cause{}, msgs[i:i+100]...); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	got := b.Receive("observer", large, 60*time.Second, time.Second)
	if len(got) != large {
		t.Fatalf("received %d messages, want the large transaction's %d and not the aborted one", len(got), large)
	}
	testenv.WaitFor(t, 20*time.Second, "every row to be PUBLISHED", b.AllPublished(large))
}

// The relay runs as two roles, each with only what it needs: its
// replication connection as one with the REPLICATION attribute and no
// grant (orders_relay_wal in the order service), the rest as one without
// it and, on the outbox's tables, what the order service grants
// orders_relay (migrations/roles_test.go holds it to that). The
// publication is the outbox's migrations'.
func TestWALRunsAsTheRelayRole(t *testing.T) {
	t.Parallel()
	b := setupRelay(t)
	role := fmt.Sprint("outbox_test_relay_", time.Now().UnixNano())
	replicator := role + "_wal"
	for _, sql := range []string{"CREATE ROLE " + role + " LOGIN NOREPLICATION", "CREATE ROLE " + replicator + " LOGIN REPLICATION"} {
		if _, err := b.Pool.Exec(b.Ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, sql := range []string{"DROP OWNED BY " + role, "DROP ROLE " + role, "DROP ROLE " + replicator} {
			if _, err := b.Pool.Exec(context.Background(), sql); err != nil {
				t.Errorf("%s: %v", sql, err)
			}
		}
	})
	for _, grant := range []string{
		"GRANT SELECT, DELETE, UPDATE (status, attempt_count, next_attempt_at, claimed_by, claimed_until, published_at, last_error, updated_at) ON message_outbox",
		"GRANT SELECT, INSERT, UPDATE, DELETE ON outbox_partition_lease",
	} {
		if _, err := b.Pool.Exec(b.Ctx, grant+" TO "+role); err != nil {
			t.Fatal(err)
		}
	}
	b.BindQueue("observer", "#")
	replicationURL := testenv.AsRole(b.DBURL, replicator)
	b.DBURL = testenv.AsRole(b.DBURL, role)
	b.Mode.NewRelay = func(b *outboxtest.Bundle, cfg outbox.Config, deps messaging.Deps) (outboxtest.Relay, error) {
		wc := testWALConfig(b)
		wc.ReplicationURL = replicationURL
		return wal.NewRelay(cfg, wc, deps)
	}
	// No slot, and rows waiting: the relay makes the slot as the replicator
	// and reads the rows before it through the slot's snapshot as the
	// other role.
	dropSlot(t, b.Pool, b.Slot)
	b.Enqueue(5, messaging.Cause{})
	r := b.StartRelay(outboxtest.Config(), b.AMQPURL, nil)
	testenv.WaitFor(t, 10*time.Second, "the relay to stream as "+replicator, func() bool { return streaming(r) })
	var streamer string
	if err := b.Pool.QueryRow(b.Ctx, "SELECT usename FROM pg_stat_activity WHERE backend_type = 'walsender' AND datname = current_database()").
		Scan(&streamer); err != nil || streamer != replicator {
		t.Fatalf("the replication connection is %q's (%v); want %s's", streamer, err, replicator)
	}
	b.Enqueue(10, messaging.Cause{})
	b.Receive("observer", 15, 20*time.Second, 0)
	testenv.WaitFor(t, 10*time.Second, "every row to be PUBLISHED", b.AllPublished(15))
	if n := b.Counter("relay.wal.slot.missing.rows"); n != 5 {
		t.Fatalf("relay.wal.slot.missing.rows = %d, want the 5 rows written before the slot", n)
	}
}

// A write-back that keeps failing (here a trigger refuses to mark rows
// PUBLISHED) ends the session: the rows it published stay PENDING, and the
// next session streams them again from the slot and marks them once the
// database takes the marks. The session must not wait for anything only
// its own end brings.
func TestWALFailedWriteBackEndsTheSession(t *testing.T) {
	t.Parallel()
	b := setupRelay(t)
	b.BindQueue("observer", "#")
	if _, err := b.Pool.Exec(b.Ctx, `CREATE TABLE refuse_marks (on_ boolean NOT NULL);
		INSERT INTO refuse_marks VALUES (false);
		CREATE FUNCTION refuse_marks() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NEW.status = 'PUBLISHED' AND (SELECT on_ FROM refuse_marks) THEN
				RAISE EXCEPTION 'marks refused by the test';
			END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER refuse_marks BEFORE UPDATE ON message_outbox FOR EACH ROW EXECUTE FUNCTION refuse_marks()`); err != nil {
		t.Fatal(err)
	}
	r := b.StartRelay(outboxtest.Config(), b.AMQPURL, nil)
	testenv.WaitFor(t, 10*time.Second, "the relay to stream", func() bool { return streaming(r) })
	// One batch through first: from here on the sweep leaves the newest
	// rows to the stream, so only the stream can mark the next ones.
	b.Enqueue(5, messaging.Cause{})
	b.Receive("observer", 5, 20*time.Second, 0)
	testenv.WaitFor(t, 10*time.Second, "the first rows to be PUBLISHED", b.AllPublished(5))

	if _, err := b.Pool.Exec(b.Ctx, "UPDATE refuse_marks SET on_ = true"); err != nil {
		t.Fatal(err)
	}
	later := b.Enqueue(10, messaging.Cause{})
	b.ReceiveEach("observer", later, 20*time.Second)
	// The write-back retries five times (some 3 s), then ends the session.
	testenv.WaitFor(t, 30*time.Second, "the session to end", func() bool { return !streaming(r) })
	if c := b.StatusCounts(); c["PENDING"] != 10 {
		t.Fatalf("status counts %v while the marks are refused, want the 10 PENDING", c)
	}

	if _, err := b.Pool.Exec(b.Ctx, "UPDATE refuse_marks SET on_ = false"); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 60*time.Second, "the rows streamed again to be PUBLISHED", b.AllPublished(15))
}

// A slot made before the publication existed, as Patroni makes a
// permanent slot as soon as the database exists, before the migrations
// run: pgoutput cannot decode what was committed before the publication
// ("publication ... does not exist"), so the slot can never be streamed.
// The relay drops it and makes it again, publishing first the PENDING rows
// written before: nothing is lost, nothing waits for the sweep.
func TestWALSlotOlderThanThePublication(t *testing.T) {
	t.Parallel()
	b := setupRelay(t)
	logs := &lockedBuffer{}
	b.Logger = slog.New(slog.NewTextHandler(logs, nil))
	const sweepAfter = 3 * time.Minute // far beyond the waits below
	b.Mode.NewRelay = func(b *outboxtest.Bundle, cfg outbox.Config, deps messaging.Deps) (outboxtest.Relay, error) {
		wc := testWALConfig(b)
		wc.SweepAfter = sweepAfter
		return wal.NewRelay(cfg, wc, deps)
	}
	b.BindQueue("observer", "#")
	dropSlot(t, b.Pool, b.Slot)
	if _, err := b.Pool.Exec(b.Ctx, "DROP PUBLICATION orders_outbox"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Pool.Exec(b.Ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", b.Slot); err != nil {
		t.Fatal(err)
	}
	before := b.Enqueue(10, messaging.Cause{}) // committed after the slot, before the publication
	if _, err := b.Pool.Exec(b.Ctx, "CREATE PUBLICATION orders_outbox FOR TABLE message_outbox WITH (publish = 'insert', publish_via_partition_root = true)"); err != nil {
		t.Fatal(err)
	}

	started := time.Now()
	r := b.StartRelay(outboxtest.Config(), b.AMQPURL, nil)
	testenv.WaitFor(t, 30*time.Second, "the relay to make the slot again", func() bool { return b.Counter("relay.wal.slot.missing") == 1 })
	testenv.WaitFor(t, 30*time.Second, "the relay to stream", func() bool { return streaming(r) })
	after := b.Enqueue(10, messaging.Cause{})
	b.ReceiveEach("observer", append(slices.Clone(before), after...), time.Minute)
	if took := time.Since(started); took > sweepAfter/3 {
		t.Fatalf("the rows took %s to go out; want well under RELAY_WAL_SWEEP_AFTER (%s)", took, sweepAfter)
	}
	testenv.WaitFor(t, 10*time.Second, "every row to be PUBLISHED", b.AllPublished(len(before)+len(after)))
	if !strings.Contains(logs.String(), "replication slot older than the publication") {
		t.Errorf("the relay's log does not say it dropped the slot older than the publication:\n%s", logs.String())
	}
	if n, rows := b.Counter("relay.wal.slot.missing"), b.Counter("relay.wal.slot.missing.rows"); n != 1 || rows != int64(len(before)) {
		t.Errorf("relay.wal.slot.missing = %d with %d rows; want 1 with the %d rows written before the publication", n, rows, len(before))
	}
}

// A write-back the database refuses as unavailable (here "shutting
// down", as a primary does during a switchover) ends the session at
// once, without the retries that wait out an outage: the primary waits,
// to shut down, for the session to confirm the end of the log, which it
// does only once written back. The rows are streamed again.
func TestWALWriteBackToAnUnavailableDatabaseEndsTheSessionAtOnce(t *testing.T) {
	t.Parallel()
	b := setupRelay(t)
	b.BindQueue("observer", "#")
	if _, err := b.Pool.Exec(b.Ctx, `CREATE TABLE refuse_marks (on_ boolean NOT NULL);
		INSERT INTO refuse_marks VALUES (false);
		CREATE FUNCTION refuse_marks() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NEW.status = 'PUBLISHED' AND (SELECT on_ FROM refuse_marks) THEN
				RAISE EXCEPTION 'the database system is shutting down' USING ERRCODE = '57P03';
			END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER refuse_marks BEFORE UPDATE ON message_outbox FOR EACH ROW EXECUTE FUNCTION refuse_marks()`); err != nil {
		t.Fatal(err)
	}
	cfg := outboxtest.Config()
	cfg.Lease = 2 * time.Minute // an outage the polling relay's marks would wait out
	r := b.StartRelay(cfg, b.AMQPURL, nil)
	testenv.WaitFor(t, 10*time.Second, "the relay to stream", func() bool { return streaming(r) })
	b.Enqueue(5, messaging.Cause{})
	b.Receive("observer", 5, 20*time.Second, 0)
	testenv.WaitFor(t, 10*time.Second, "the first rows to be PUBLISHED", b.AllPublished(5))

	if _, err := b.Pool.Exec(b.Ctx, "UPDATE refuse_marks SET on_ = true"); err != nil {
		t.Fatal(err)
	}
	later := b.Enqueue(10, messaging.Cause{})
	b.ReceiveEach("observer", later, 20*time.Second)
	refused := time.Now()
	testenv.WaitFor(t, 30*time.Second, "the session to end", func() bool { return !streaming(r) })
	if took := time.Since(refused); took > 10*time.Second {
		t.Fatalf("the session ended %s after the write-back was refused as unavailable; want at once", took)
	}
	if _, err := b.Pool.Exec(b.Ctx, "UPDATE refuse_marks SET on_ = false"); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 60*time.Second, "the rows streamed again to be PUBLISHED", b.AllPublished(15))
}
