package outboxtest

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/messaging"
	"github.com/yourorg/orders/internal/messaging/outbox"
	"github.com/yourorg/orders/internal/testenv"
)

// TimePartitionsFrom lays a new database's message_outbox out as if the
// relays had made its weekly time partitions since start: the initial
// partition ends at start, and weeks follow up to the horizon, so that
// rows written with an older created_at land in partitions retention may
// drop. The table must be empty; db must own it (a test's own pool).
func TimePartitionsFrom(t testing.TB, pool *pgxpool.Pool, start time.Time) {
	t.Helper()
	ctx := t.Context()
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var rows int
		if err := tx.QueryRow(ctx, "SELECT count(*) FROM message_outbox").Scan(&rows); err != nil {
			return err
		}
		if rows != 0 {
			return fmt.Errorf("message_outbox holds %d rows: lay its partitions out first", rows)
		}
		parts, err := tx.Query(ctx, "SELECT partition_name FROM outbox_time_partition_bounds()")
		if err != nil {
			return err
		}
		names, err := pgx.CollectRows(parts, pgx.RowTo[string])
		if err != nil {
			return err
		}
		for _, name := range names {
			if _, err := tx.Exec(ctx, "DROP TABLE "+pgx.Identifier{name}.Sanitize()); err != nil {
				return err
			}
		}
		_, err = tx.Exec(ctx, fmt.Sprintf("CREATE TABLE message_outbox_initial PARTITION OF message_outbox FOR VALUES FROM (MINVALUE) TO ('%s')",
			start.UTC().Format(time.RFC3339)))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.CreateTimePartitions(ctx, pool, outbox.Week); err != nil {
		t.Fatal(err)
	}
}

// WriteAt commits one message of aggregate, of type typ, written at
// createdAt (an outbox row's time, which picks its time partition), and
// returns its id.
func WriteAt(t testing.TB, db database.DBTX, aggregate uuid.UUID, typ string, createdAt time.Time) uuid.UUID {
	t.Helper()
	id := uuid.Must(uuid.NewV7())
	if _, err := db.Exec(t.Context(), `INSERT INTO message_outbox (outbox_id, aggregate_type, aggregate_id, message_type, message_version,
		exchange_name, routing_key, payload, created_at) VALUES ($1, 'test', $2, $3, 1, $4, $3, $5, $6)`,
		id, aggregate.String(), typ, Exchange, fmt.Sprintf(`{"id": %q}`, aggregate), createdAt); err != nil {
		t.Fatal(err)
	}
	return id
}

// A backlog that straddles the boundary between two time partitions goes
// out whole, each aggregate's messages in the order they were written,
// across the boundary.
func testABacklogAcrossTimePartitionsGoesOutInOrder(t *testing.T, mode Mode) {
	t.Parallel()
	b := Setup(t, mode)
	b.BindQueue("observer", TypeCancelled)
	boundary := lastMonday()
	TimePartitionsFrom(t, b.Pool, boundary.Add(-7*24*time.Hour))
	want := map[string][]string{}
	var all []uuid.UUID
	for _, offset := range []time.Duration{-2 * time.Minute, -time.Minute, -time.Second, time.Second, time.Minute} {
		for _, aggregate := range []uuid.UUID{uuid.MustParse("00000000-0000-0000-0000-00000000000a"), uuid.MustParse("00000000-0000-0000-0000-00000000000b")} {
			id := WriteAt(t, b.Pool, aggregate, TypeCancelled, boundary.Add(offset))
			want[aggregate.String()] = append(want[aggregate.String()], id.String())
			all = append(all, id)
		}
	}
	var partitions int
	if err := b.Pool.QueryRow(b.Ctx, "SELECT count(DISTINCT tableoid) FROM message_outbox").Scan(&partitions); err != nil || partitions != 2 {
		t.Fatalf("the backlog is in %d time partitions (%v), want 2", partitions, err)
	}
	b.StartRelay(Config(), b.AMQPURL, nil)

	// The log-tailing relay's sweep takes a row its stream has not written
	// back yet when the row looks older than the stream's position, as
	// these do: a duplicate, which follows the first copy. The first
	// copies keep the order.
	got := map[string][]string{}
	seen := map[string]bool{}
	for _, d := range b.Receive("observer", len(all), 30*time.Second, 2*time.Second) {
		if seen[d.MessageId] {
			continue
		}
		seen[d.MessageId] = true
		var m Message
		if err := json.Unmarshal(d.Body, &m); err != nil {
			t.Fatal(err)
		}
		got[m.ID.String()] = append(got[m.ID.String()], d.MessageId)
	}
	for aggregate, ids := range want {
		if !slices.Equal(got[aggregate], ids) {
			t.Errorf("aggregate %s: received %v, want %v in that order", aggregate, got[aggregate], ids)
		}
	}
	testenv.WaitFor(t, 15*time.Second, "every row PUBLISHED", b.AllPublished(len(all)))
}

// A time partition made while the relay runs (as the relays make them
// ahead) needs nothing of the relay: its rows are published, by the log
// stream too (the publication publishes through the partitioned table).
func testATimePartitionMadeWhileRunningIsPublished(t *testing.T, mode Mode) {
	t.Parallel()
	b := Setup(t, mode)
	b.BindQueue("observer", TypeCancelled)
	b.StartRelay(Config(), b.AMQPURL, nil)
	first := b.Enqueue(1, messaging.Cause{})
	b.Receive("observer", len(first), 15*time.Second, 0)

	var horizon time.Time
	if err := b.Pool.QueryRow(b.Ctx, "SELECT max(range_end) FROM outbox_time_partition_bounds()").Scan(&horizon); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Pool.Exec(b.Ctx, fmt.Sprintf("CREATE TABLE message_outbox_made_while_running PARTITION OF message_outbox FOR VALUES FROM ('%s') TO ('%s')",
		horizon.Format(time.RFC3339), horizon.Add(24*time.Hour).Format(time.RFC3339))); err != nil {
		t.Fatal(err)
	}
	id := WriteAt(t, b.Pool, uuid.New(), TypeCancelled, horizon.Add(time.Hour))
	if got := b.Receive("observer", 1, 15*time.Second, 0); got[0].MessageId != id.String() {
		t.Fatalf("received %s, want the row of the new time partition, %s", got[0].MessageId, id)
	}
	testenv.WaitFor(t, 15*time.Second, "both rows PUBLISHED", b.AllPublished(2))
}

// lastMonday is the start of this week's time partition: Monday 00:00 UTC.
func lastMonday() time.Time {
	now := time.Now().UTC()
	day := time.Date(now.Year(), now.Month(), now.Day(), 0, 0, 0, 0, time.UTC)
	return day.AddDate(0, 0, -((int(day.Weekday()) + 6) % 7))
}
