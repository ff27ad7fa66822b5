package outbox_test

import (
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/messaging"
	"github.com/yourorg/orders/internal/messaging/outbox"
	"github.com/yourorg/orders/internal/messaging/outbox/outboxtest"
	"github.com/yourorg/orders/internal/testenv"
)

// Relays make the time partitions ahead side by side: each call finds
// those the others made, and all agree on where the last one ends, a
// whole number of periods past the previous end, with no gap between two
// partitions.
func TestTimePartitionsAreMadeAheadOnce(t *testing.T) {
	t.Parallel()
	db := testenv.NewDatabase(t, outbox.Schema)
	ctx := t.Context()
	for _, period := range []string{outbox.Week, outbox.Day} {
		horizons := make([]time.Time, 4)
		var wg sync.WaitGroup
		errs := make([]error, len(horizons))
		for i := range horizons {
			wg.Go(func() { horizons[i], errs[i] = outbox.CreateTimePartitions(ctx, db.Pool, period) })
		}
		wg.Wait()
		for i := range horizons {
			if errs[i] != nil {
				t.Fatal(errs[i])
			}
			if !horizons[i].Equal(horizons[0]) {
				t.Fatalf("%s: the relays disagree on the horizon: %v", period, horizons)
			}
		}
		ahead := time.Duration(outbox.TimePartitionsAhead(period)) * 24 * time.Hour
		if period == outbox.Week {
			ahead *= 7
		}
		if horizons[0].Before(time.Now().Add(ahead)) {
			t.Fatalf("%s: the last time partition ends %s, want at least %s ahead", period, horizons[0], ahead)
		}
	}
	rows, err := db.Pool.Query(ctx, "SELECT partition_name, range_start, range_end FROM outbox_time_partition_bounds()")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var last *time.Time
	var n int
	for rows.Next() {
		var name string
		var start, end *time.Time
		if err := rows.Scan(&name, &start, &end); err != nil {
			t.Fatal(err)
		}
		if (last == nil) != (start == nil) || last != nil && !last.Equal(*start) {
			t.Fatalf("partition %s starts at %v, the one before it ends at %v", name, start, last)
		}
		last, n = end, n+1
	}
	if err := rows.Err(); err != nil || n < 5 {
		t.Fatalf("%d time partitions, %v", n, err)
	}
}

// A running system is converted while writes go on and a relay publishes:
// the rows it had stay as they were, in every state, in the initial
// partition, none moved, none published again; every message written
// before, during and after the migration is published once.
func TestMigratingToTimePartitionsWhileRunning(t *testing.T) {
	t.Parallel()
	b := outboxtest.Setup(t, outboxtest.Poll)
	b.BindQueue("observer", outboxtest.TypeCancelled)
	ctx := b.Ctx
	m, err := database.NewMigrator(b.Pool, slog.New(slog.NewTextHandler(io.Discard, nil)), outbox.Schema)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = m.Close() }()
	if err := m.DownTo(ctx, 7); err != nil {
		t.Fatal(err)
	}
	var kind string
	if err := b.Pool.QueryRow(ctx, "SELECT relkind::text FROM pg_class WHERE oid = 'message_outbox'::regclass").Scan(&kind); err != nil || kind != "r" {
		t.Fatalf("before: message_outbox is of kind %q (%v), want a plain table", kind, err)
	}
	// A row in every state a relay leaves, written long ago.
	if _, err := b.Pool.Exec(ctx, `
		INSERT INTO message_outbox (outbox_id, aggregate_type, aggregate_id, message_type, message_version, exchange_name, routing_key, payload,
		    status, attempt_count, claimed_by, claimed_until, published_at, last_error, created_at)
		VALUES
		    (gen_random_uuid(), 'test', 'b', 'test.cancelled', 1, 'test.events', 'test.cancelled', '{}', 'PUBLISHING', 1, 'relay-1', now() + interval '1 hour', NULL, NULL, now() - interval '30 days'),
		    (gen_random_uuid(), 'test', 'c', 'test.cancelled', 1, 'test.events', 'test.cancelled', '{}', 'PUBLISHED', 1, NULL, NULL, now() - interval '29 days', NULL, now() - interval '30 days'),
		    (gen_random_uuid(), 'test', 'd', 'test.cancelled', 1, 'test.events', 'test.cancelled', '{}', 'FAILED', 10, NULL, NULL, NULL, 'returned: NO_ROUTE', now() - interval '30 days')`); err != nil {
		t.Fatal(err)
	}
	const settled = "SELECT string_agg(m::text, E'\\n' ORDER BY outbox_id) FROM message_outbox m WHERE aggregate_id IN ('b', 'c', 'd')"
	var before string
	if err := b.Pool.QueryRow(ctx, settled).Scan(&before); err != nil {
		t.Fatal(err)
	}
	written := b.Enqueue(20, messaging.Cause{}) // PENDING, before

	b.StartRelay(outboxtest.Config(), b.AMQPURL, nil)
	done := make(chan struct{})
	var during []uuid.UUID
	go func() {
		defer close(done)
		for range 40 {
			ids, err := outboxtest.Writer.Write(ctx, b.Pool, messaging.Cause{}, outboxtest.Message{Type: outboxtest.TypeCancelled, ID: uuid.New()})
			if err != nil {
				t.Error(err)
				return
			}
			during = append(during, ids...)
			time.Sleep(10 * time.Millisecond)
		}
	}()
	if err := m.Up(ctx); err != nil {
		t.Fatal(err)
	}
	<-done
	written = append(append(written, during...), b.Enqueue(20, messaging.Cause{})...) // and after

	got := b.Receive("observer", len(written), 30*time.Second, time.Second)
	ids := make([]string, len(got))
	for i, d := range got {
		ids[i] = d.MessageId
	}
	want := make([]string, len(written))
	for i, id := range written {
		want[i] = id.String()
	}
	slices.Sort(ids)
	slices.Sort(want)
	if !slices.Equal(ids, want) {
		t.Fatalf("received %d messages, want each of the %d written once", len(ids), len(want))
	}
	var after string
	if err := b.Pool.QueryRow(ctx, settled).Scan(&after); err != nil || after != before {
		t.Fatalf("the rows of the table before:\n%s\nafter:\n%s (%v)", before, after, err)
	}

	var partitioned, pubviaroot bool
	var key, initial, published string
	if err := b.Pool.QueryRow(ctx, `SELECT
		    (SELECT relkind = 'p' FROM pg_class WHERE oid = 'message_outbox'::regclass),
		    (SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = 'message_outbox'::regclass AND contype = 'p'),
		    (SELECT string_agg(aggregate_id, ',' ORDER BY aggregate_id) FROM message_outbox_initial WHERE aggregate_id IN ('b', 'c', 'd')),
		    (SELECT pubviaroot FROM pg_publication WHERE pubname = 'orders_outbox'),
		    (SELECT string_agg(tablename, ',') FROM pg_publication_tables WHERE pubname = 'orders_outbox')`).
		Scan(&partitioned, &key, &initial, &pubviaroot, &published); err != nil {
		t.Fatal(err)
	}
	if !partitioned || key != "PRIMARY KEY (outbox_id, created_at)" || initial != "b,c,d" || !pubviaroot || published != "message_outbox" {
		t.Fatalf("after: partitioned %v, key %q, initial partition's rows %q, publication via the root %v of %q",
			partitioned, key, initial, pubviaroot, published)
	}
}
