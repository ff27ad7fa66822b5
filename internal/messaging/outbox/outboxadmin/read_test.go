package outboxadmin_test

import (
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/messaging"
	"github.com/yourorg/orders/internal/messaging/outbox"
	"github.com/yourorg/orders/internal/messaging/outbox/outboxadmin"
	"github.com/yourorg/orders/internal/messaging/outbox/outboxtest"
	"github.com/yourorg/orders/internal/testenv"
)

// The read API shows rows in each state: one aggregate's messages (also to
// a role that may only call outbox_messages_of_aggregate), one row as the
// relay publishes it, the FAILED ones, the stuck ones, the counts, and an
// operator's retry.
func TestReadShowsRowsInEachState(t *testing.T) {
	t.Parallel()
	db := testenv.NewDatabase(t, outbox.Schema)
	ctx := t.Context()
	order := uuid.New()
	w := outbox.Writer{Producer: "test-producer", Exchange: outboxtest.Exchange, AggregateType: "order"}
	cause := messaging.Cause{CorrelationID: "corr-1", MessageID: "m-0"}
	ids, err := w.Write(ctx, db.Pool, cause,
		outboxtest.Message{Type: outboxtest.TypeSubmitted, ID: order}, outboxtest.Message{Type: outboxtest.TypeCancelled, ID: order}, outboxtest.Message{Type: outboxtest.TypeRejected, ID: order})
	if err != nil {
		t.Fatal(err)
	}
	other, err := w.Write(ctx, db.Pool, cause, outboxtest.Message{Type: outboxtest.TypeFulfilled, ID: uuid.New()})
	if err != nil {
		t.Fatal(err)
	}

	// The rows as the relay leaves them (its statements are package
	// outbox's tests): ids[0] PUBLISHED, ids[1] PUBLISHING, ids[2]
	// PENDING; the other aggregate's FAILED.
	for _, set := range []struct {
		id  uuid.UUID
		sql string
	}{
		{ids[0], "status = 'PUBLISHED', attempt_count = 1, published_at = now()"},
		{ids[1], "status = 'PUBLISHING', attempt_count = 1, claimed_by = 'relay-a', claimed_until = now() + interval '1 minute'"},
		{other[0], "status = 'FAILED', attempt_count = 1, last_error = 'NO_ROUTE'"},
	} {
		if _, err := db.Pool.Exec(ctx, "UPDATE message_outbox SET "+set.sql+" WHERE outbox_id = $1", set.id); err != nil {
			t.Fatal(err)
		}
	}
	want := map[uuid.UUID]string{ids[0]: "PUBLISHED", ids[1]: "PUBLISHING", ids[2]: "PENDING"}

	reader := db.NewRole(t, "GRANT EXECUTE ON FUNCTION outbox_messages_of_aggregate(text, text) TO %s")
	for role, p := range map[string]*pgxpool.Pool{"the owner": db.Pool, reader: pool(t, db, reader)} {
		msgs, err := outboxadmin.Aggregate(ctx, p, "order", order.String())
		if err != nil {
			t.Fatalf("as %s: %v", role, err)
		}
		var got []uuid.UUID
		for _, m := range msgs {
			got = append(got, m.ID)
			if m.Status != want[m.ID] || m.AggregateID != order.String() || m.Producer != "test-producer" ||
				m.CorrelationID != "corr-1" || m.CausationID != "m-0" || m.CreatedAt.IsZero() || (m.PublishedAt != nil) != (m.Status == "PUBLISHED") {
				t.Errorf("as %s: %+v, want status %s", role, m, want[m.ID])
			}
		}
		if !slices.Equal(got, ids) {
			t.Errorf("as %s: messages %v, want %v (oldest first, not another aggregate's)", role, got, ids)
		}
	}
	if _, err := pool(t, db, reader).Exec(ctx, "SELECT count(*) FROM message_outbox"); err == nil {
		t.Error("a role with EXECUTE on the function alone read the table")
	}

	failed, err := outboxadmin.Failed(ctx, db.Pool, "", 10)
	if err != nil || len(failed) != 1 || failed[0].ID != other[0] || failed[0].LastError != "NO_ROUTE" || failed[0].Attempts != 1 {
		t.Fatalf("Failed: %+v, %v", failed, err)
	}
	if failed, err := outboxadmin.Failed(ctx, db.Pool, outboxtest.TypeSubmitted, 10); err != nil || len(failed) != 0 {
		t.Fatalf("Failed of %s: %+v, %v", outboxtest.TypeSubmitted, failed, err)
	}

	stuck, err := outboxadmin.Stuck(ctx, db.Pool, 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	var stuckIDs []uuid.UUID
	for _, m := range stuck {
		stuckIDs = append(stuckIDs, m.ID)
	}
	if want := []uuid.UUID{other[0], ids[2], ids[1]}; !slices.Equal(stuckIDs, want) {
		t.Errorf("Stuck: %v, want %v (FAILED, then PENDING, then PUBLISHING)", stuckIDs, want)
	}
	if stuck, err := outboxadmin.Stuck(ctx, db.Pool, time.Hour, 10); err != nil || len(stuck) != 1 {
		t.Errorf("Stuck older than an hour: %+v, %v; want the FAILED row alone", stuck, err)
	}

	stats, err := outboxadmin.Stats(ctx, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]int64{}
	for _, s := range stats {
		counts[s.Status+" "+s.MessageType] = s.Rows
		if s.Status == "PENDING" && s.OldestAge <= 0 {
			t.Errorf("PENDING %s: oldest age %s", s.MessageType, s.OldestAge)
		}
	}
	if want := map[string]int64{"FAILED " + outboxtest.TypeFulfilled: 1, "PUBLISHING " + outboxtest.TypeCancelled: 1, "PENDING " + outboxtest.TypeRejected: 1}; !maps.Equal(counts, want) {
		t.Errorf("Stats: %v, want %v", counts, want)
	}

	row, err := outboxadmin.Get(ctx, db.Pool, ids[0])
	if err != nil || row.ID != ids[0] || row.AggregateID != order.String() || row.Type != outboxtest.TypeSubmitted || row.Version != 1 ||
		row.Exchange != outboxtest.Exchange || row.RoutingKey != outboxtest.TypeSubmitted || !strings.Contains(string(row.Payload), order.String()) ||
		row.Headers["correlation_id"] != "corr-1" || row.Attempt != 1 || row.Partition != -1 {
		t.Errorf("Get: %+v, %v", row, err)
	}
	if _, err := outboxadmin.Get(ctx, db.Pool, uuid.New()); !errors.Is(err, database.ErrNotFound) {
		t.Errorf("Get of a row that is not there: %v, want database.ErrNotFound", err)
	}

	retried, err := outboxadmin.RetryFailed(ctx, db.Pool, []uuid.UUID{other[0], ids[1]}, "")
	if err != nil || len(retried) != 1 || retried[0].ID != other[0] || retried[0].Status != "PENDING" || retried[0].Attempts != 0 || retried[0].LastError != "NO_ROUTE" {
		t.Fatalf("RetryFailed: %+v, %v; want the FAILED row alone, PENDING", retried, err)
	}
}

// pool connects to db as role.
func pool(t *testing.T, db *testenv.Database, role string) *pgxpool.Pool {
	t.Helper()
	p, err := database.NewPool(t.Context(), database.PoolConfig{URL: db.URLAs(role)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// Retention drops a time partition whole once it ended retention ago and
// every row of it was PUBLISHED retention ago; one holding a row not
// PUBLISHED (FAILED, PENDING), or published within retention, waits, and
// says how many rows it waits for; it goes at the first retention after
// they are done.
func TestDropTimePartitionsWaitsForUnfinishedRows(t *testing.T) {
	t.Parallel()
	db := testenv.NewDatabase(t, outbox.Schema)
	ctx := t.Context()
	monday := time.Now().UTC().Truncate(24 * time.Hour)
	monday = monday.AddDate(0, 0, -((int(monday.Weekday()) + 6) % 7))
	week := 7 * 24 * time.Hour
	outboxtest.TimePartitionsFrom(t, db.Pool, monday.Add(-4*week))
	set := func(id uuid.UUID, status string, publishedAt any) {
		t.Helper()
		if _, err := db.Pool.Exec(ctx, "UPDATE message_outbox SET status = $2, published_at = $3 WHERE outbox_id = $1", id, status, publishedAt); err != nil {
			t.Fatal(err)
		}
	}
	write := func(weeksAgo int) uuid.UUID {
		t.Helper()
		return outboxtest.WriteAt(t, db.Pool, uuid.New(), outboxtest.TypeCancelled, monday.Add(-time.Duration(weeksAgo)*week+time.Hour))
	}
	longAgo := monday.Add(-5 * week)
	set(write(4), "PUBLISHED", longAgo) // the oldest week: all published long ago
	set(write(4), "PUBLISHED", longAgo)
	set(write(3), "PUBLISHED", longAgo)
	failed := write(3) // the next: one FAILED
	set(failed, "FAILED", nil)
	late := write(2) // the last past retention: one published just now, one PENDING
	set(late, "PUBLISHED", time.Now())
	pending := write(2)
	set(write(1), "PUBLISHED", longAgo) // this week's end is within retention

	retention := week
	names := func(parts []outboxadmin.TimePartition, keep func(outboxadmin.TimePartition) bool) map[string]int64 {
		out := map[string]int64{}
		for _, p := range parts {
			if keep(p) {
				out[p.Name] = p.HeldRows
			}
		}
		return out
	}
	name := func(weeksAgo int) string {
		return "message_outbox_p" + monday.Add(-time.Duration(weeksAgo)*week).Format("20060102")
	}
	parts, err := outboxadmin.TimePartitions(ctx, db.Pool, retention)
	if err != nil {
		t.Fatal(err)
	}
	past := names(parts, func(p outboxadmin.TimePartition) bool { return p.PastRetention })
	if want := map[string]int64{"message_outbox_initial": 0, name(4): 0, name(3): 1, name(2): 2}; !maps.Equal(past, want) {
		t.Fatalf("past retention, with the rows they wait for: %v, want %v", past, want)
	}
	if parts[len(parts)-1].Ends.Before(time.Now().Add(3 * week)) {
		t.Errorf("the last time partition ends %s: want at least three weeks ahead", parts[len(parts)-1].Ends)
	}

	parts, err = outboxadmin.DropTimePartitions(ctx, db.Pool, retention)
	if err != nil {
		t.Fatal(err)
	}
	dropped := names(parts, func(p outboxadmin.TimePartition) bool { return p.Dropped })
	if want := map[string]int64{"message_outbox_initial": 0, name(4): 0}; !maps.Equal(dropped, want) {
		t.Fatalf("dropped %v, want %v", dropped, want)
	}
	var rows int
	if err := db.Pool.QueryRow(ctx, "SELECT count(*) FROM message_outbox").Scan(&rows); err != nil || rows != 5 {
		t.Fatalf("%d rows left (%v), want the 5 of the partitions kept", rows, err)
	}
	if parts, err = outboxadmin.TimePartitions(ctx, db.Pool, 0); err != nil || len(names(parts, func(p outboxadmin.TimePartition) bool { return p.PastRetention })) != 0 {
		t.Fatalf("retention 0 keeps everything: %+v, %v", parts, err)
	}

	// Once they are done, the next retention drops them.
	set(failed, "PUBLISHED", longAgo)
	set(late, "PUBLISHED", longAgo)
	set(pending, "PUBLISHED", longAgo)
	parts, err = outboxadmin.DropTimePartitions(ctx, db.Pool, retention)
	if err != nil {
		t.Fatal(err)
	}
	if dropped := names(parts, func(p outboxadmin.TimePartition) bool { return p.Dropped }); !maps.Equal(dropped, map[string]int64{name(3): 0, name(2): 0}) {
		t.Fatalf("then dropped %v, want the two that waited", dropped)
	}
	if err := db.Pool.QueryRow(ctx, "SELECT count(*) FROM message_outbox").Scan(&rows); err != nil || rows != 1 {
		t.Fatalf("%d rows left (%v), want this week's", rows, err)
	}
}
