package inbox_test

import (
	"errors"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/messaging/inbox"
	"github.com/yourorg/orders/internal/messaging/inbox/inboxadmin"
	"github.com/yourorg/orders/internal/testenv"
)

// The read API shows rows in each state: one row, one aggregate's rows
// (also to a role that may only call inbox_rows_of_aggregate), the rows
// not PROCESSED, and the counts.
func TestReadShowsRowsInEachState(t *testing.T) {
	t.Parallel()
	db := testenv.NewDatabase(t, inbox.Schema)
	ctx := t.Context()
	order := uuid.NewString()
	entry := func(consumer string) inbox.Entry {
		return inbox.Entry{Consumer: consumer, MessageID: uuid.NewString(), Type: "test.submitted", Version: 1, AggregateID: order,
			PayloadHash: "h", CorrelationID: "corr-1", CausationID: "m-0", TraceID: "t-1"}
	}
	processed, held, retrying, poisoned := entry("a"), entry("b"), entry("c"), entry("d")
	otherOrder := entry("a")
	otherOrder.AggregateID = uuid.NewString()
	for _, e := range []inbox.Entry{processed, held, otherOrder} {
		err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			if _, err := inbox.Begin(ctx, tx, e, time.Minute); err != nil {
				return err
			}
			if e == held {
				return inbox.Hold(ctx, tx, e.Consumer, e.MessageID)
			}
			return inbox.MarkProcessed(ctx, tx, e.Consumer, e.MessageID, inbox.OutcomeIgnored, "already so")
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []struct {
		e      inbox.Entry
		status string
	}{{retrying, inbox.StatusRetryableFailed}, {poisoned, inbox.StatusPoisoned}} {
		if _, err := inbox.RecordFailure(ctx, db.Pool, f.e, inbox.Failure{Status: f.status, Code: "E", Message: "it failed"}); err != nil {
			t.Fatal(err)
		}
	}
	want := map[string]string{processed.MessageID: inbox.StatusProcessed, held.MessageID: inbox.StatusProcessing,
		retrying.MessageID: inbox.StatusRetryableFailed, poisoned.MessageID: inbox.StatusPoisoned}

	row, err := inboxadmin.Get(ctx, db.Pool, "a", processed.MessageID)
	if err != nil {
		t.Fatal(err)
	}
	if row.Status != inbox.StatusProcessed || row.Outcome != inbox.OutcomeIgnored || row.OutcomeReason != "already so" || row.Attempts != 1 ||
		row.Version != 1 || row.AggregateID != order || row.PayloadHash != "h" || row.CorrelationID != "corr-1" || row.CausationID != "m-0" ||
		row.TraceID != "t-1" || row.ProcessedAt == nil || row.ProcessingStartedAt == nil {
		t.Errorf("Get: %+v", row)
	}
	if _, err := inboxadmin.Get(ctx, db.Pool, "b", processed.MessageID); !errors.Is(err, database.ErrNotFound) {
		t.Errorf("Get of a row that is not there: %v, want database.ErrNotFound", err)
	}

	reader := db.NewRole(t, "GRANT EXECUTE ON FUNCTION inbox_rows_of_aggregate(text) TO %s")
	readerPool, err := database.NewPool(ctx, database.PoolConfig{URL: db.URLAs(reader)})
	if err != nil {
		t.Fatal(err)
	}
	defer readerPool.Close()
	if _, err := readerPool.Exec(ctx, "SELECT count(*) FROM message_inbox"); err == nil {
		t.Error("a role with EXECUTE on the function alone read the table")
	}
	for role, pool := range map[string]*pgxpool.Pool{"the owner": db.Pool, reader: readerPool} {
		rows, err := inboxadmin.Aggregate(ctx, pool, order)
		if err != nil {
			t.Fatalf("as %s: %v", role, err)
		}
		var consumers []string
		for _, r := range rows {
			consumers = append(consumers, r.Consumer)
			if r.Status != want[r.MessageID] || r.AggregateID != order || r.TraceID != "t-1" || r.Type != "test.submitted" || r.PayloadHash != "" {
				t.Errorf("as %s: %+v, want status %s", role, r, want[r.MessageID])
			}
			if failed := r.Status == inbox.StatusRetryableFailed || r.Status == inbox.StatusPoisoned; failed != (r.LastErrorCode == "E") {
				t.Errorf("as %s: %s row with last error %q", role, r.Status, r.LastErrorCode)
			}
		}
		if want := []string{"a", "b", "c", "d"}; !slices.Equal(consumers, want) {
			t.Errorf("as %s: rows of %v, want %v (by first delivery, not another order's)", role, consumers, want)
		}
	}

	unprocessed, err := inboxadmin.Unprocessed(ctx, db.Pool, 10)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, r := range unprocessed {
		ids = append(ids, r.MessageID)
	}
	if want := []string{held.MessageID, retrying.MessageID, poisoned.MessageID}; !slices.Equal(slices.Sorted(slices.Values(ids)), slices.Sorted(slices.Values(want))) {
		t.Errorf("Unprocessed: %v, want %v", ids, want)
	}

	stats, err := inboxadmin.Stats(ctx, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]int64{}
	for _, s := range stats {
		counts[s.Consumer+" "+s.Status] = s.Rows
		if s.OldestAge <= 0 {
			t.Errorf("%s %s: oldest age %s", s.Consumer, s.Status, s.OldestAge)
		}
	}
	if want := map[string]int64{"b PROCESSING": 1, "c RETRYABLE_FAILED": 1, "d POISONED": 1}; !maps.Equal(counts, want) {
		t.Errorf("Stats: %v, want %v", counts, want)
	}
}
