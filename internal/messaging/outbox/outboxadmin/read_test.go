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

func TestDeletePublishedKeepsTheWindow(t *testing.T) {
	t.Parallel()
	db := testenv.NewDatabase(t, outbox.Schema)
	ctx := t.Context()
	msgs := make([]messaging.Message, 5)
	for i := range msgs {
		msgs[i] = outboxtest.Message{Type: outboxtest.TypeCancelled, ID: uuid.New()}
	}
	ids, err := outboxtest.Writer.Write(ctx, db.Pool, messaging.Cause{}, msgs...)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := outboxtest.PublishDue(ctx, db.Pool, "relay-a"); err != nil {
		t.Fatal(err)
	}
	// Two were published long ago; one is PUBLISHING again.
	if _, err := db.Pool.Exec(ctx, "UPDATE message_outbox SET published_at = now() - interval '8 days' WHERE outbox_id = ANY($1)", ids[:2]); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, "UPDATE message_outbox SET status = 'PUBLISHING', published_at = NULL, claimed_by = 'relay-a', claimed_until = now() + interval '1 minute' WHERE outbox_id = $1", ids[4]); err != nil {
		t.Fatal(err)
	}
	if n, err := outboxadmin.DeletePublished(ctx, db.Pool, 7*24*time.Hour, 1000); err != nil || n != 2 {
		t.Fatalf("deleted %d, %v", n, err)
	}
	stats, err := outboxadmin.Stats(ctx, db.Pool)
	if err != nil || len(stats) != 1 || stats[0].Status != "PUBLISHING" || stats[0].Rows != 1 {
		t.Fatalf("stats: %+v, %v; want the PUBLISHING row alone", stats, err)
	}
	var published int
	if err := db.Pool.QueryRow(ctx, "SELECT count(*) FROM message_outbox WHERE status = 'PUBLISHED'").Scan(&published); err != nil || published != 2 {
		t.Fatalf("%d PUBLISHED rows left (%v), want the 2 recent ones", published, err)
	}
}
