package store_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/yourorg/orders/internal/domain"
	"github.com/yourorg/orders/internal/store"
)

func enqueue(t *testing.T, b testBundle, n int) []uuid.UUID {
	t.Helper()
	msgs := make([]domain.Message, n)
	for i := range msgs {
		msgs[i] = domain.OrderCancelledV1{ID: uuid.New()}
	}
	ids, err := store.EnqueueMessages(b.ctx, b.pool, store.MessageMeta{}, msgs...)
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

func rowStatus(t *testing.T, b testBundle, id uuid.UUID) (status string, attempts int) {
	t.Helper()
	if err := b.pool.QueryRow(b.ctx, "SELECT status, attempt_count FROM message_outbox WHERE outbox_id = $1", id).Scan(&status, &attempts); err != nil {
		t.Fatal(err)
	}
	return status, attempts
}

// Claims are oldest first, disjoint, and a mark only touches the claim it
// names: a relay that lost its lease cannot overwrite a newer claim.
func TestClaimAndMarkAreFencedByAttempt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := enqueue(t, b, 3)

	first, err := store.ClaimOutbox(b.ctx, b.pool, "relay-a", 2, time.Minute)
	if err != nil || len(first) != 2 || first[0].ID != ids[0] || first[1].ID != ids[1] || first[0].Attempt != 1 {
		t.Fatalf("first claim: %+v, %v", first, err)
	}
	second, err := store.ClaimOutbox(b.ctx, b.pool, "relay-b", 10, time.Minute)
	if err != nil || len(second) != 1 || second[0].ID != ids[2] {
		t.Fatalf("second claim overlaps: %+v, %v", second, err)
	}

	// relay-a's lease on ids[0] ends; the row is recovered and claimed again.
	if _, err := b.pool.Exec(b.ctx, "UPDATE message_outbox SET claimed_until = now() - interval '1s' WHERE outbox_id = $1", ids[0]); err != nil {
		t.Fatal(err)
	}
	if n, err := store.RecoverExpiredOutboxClaims(b.ctx, b.pool, 10); err != nil || n != 1 {
		t.Fatalf("recovered %d, %v", n, err)
	}
	again, err := store.ClaimOutbox(b.ctx, b.pool, "relay-b", 10, time.Minute)
	if err != nil || len(again) != 1 || again[0].ID != ids[0] || again[0].Attempt != 2 {
		t.Fatalf("reclaim: %+v, %v", again, err)
	}
	// relay-a, late, marks its old claim: nothing happens.
	if n, err := store.MarkOutboxPublished(b.ctx, b.pool, []store.Claim{first[0].Claim()}); err != nil || n != 0 {
		t.Fatalf("stale mark touched %d rows, %v", n, err)
	}
	if _, err := store.MarkOutboxFailed(b.ctx, b.pool, []store.PublishFailure{{Claim: first[0].Claim(), Reason: "late"}}, 10); err != nil {
		t.Fatal(err)
	}
	if status, attempts := rowStatus(t, b, ids[0]); status != "PUBLISHING" || attempts != 2 {
		t.Fatalf("row after stale marks: %s attempt %d", status, attempts)
	}
	// The current claim marks it.
	if n, err := store.MarkOutboxPublished(b.ctx, b.pool, []store.Claim{again[0].Claim()}); err != nil || n != 1 {
		t.Fatalf("mark: %d, %v", n, err)
	}
}

func TestMarkFailedBacksOffThenFails(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := enqueue(t, b, 1)[0]
	for attempt := 1; attempt <= 3; attempt++ {
		if _, err := b.pool.Exec(b.ctx, "UPDATE message_outbox SET next_attempt_at = now()"); err != nil {
			t.Fatal(err)
		}
		rows, err := store.ClaimOutbox(b.ctx, b.pool, "r", 1, time.Minute)
		if err != nil || len(rows) != 1 {
			t.Fatalf("attempt %d: claim %v, %v", attempt, rows, err)
		}
		failed, err := store.MarkOutboxFailed(b.ctx, b.pool, []store.PublishFailure{{Claim: rows[0].Claim(), Reason: "nacked", RetryIn: time.Hour}}, 3)
		if err != nil {
			t.Fatal(err)
		}
		status, _ := rowStatus(t, b, id)
		if attempt < 3 && (status != "PENDING" || len(failed) != 0) {
			t.Fatalf("attempt %d: %s, failed %v", attempt, status, failed)
		}
		if attempt == 3 && (status != "FAILED" || len(failed) != 1 || failed[0] != id) {
			t.Fatalf("last attempt: %s, failed %v", status, failed)
		}
		if attempt < 3 {
			// Not due before its backoff ends.
			if rows, _ := store.ClaimOutbox(b.ctx, b.pool, "r", 1, time.Minute); len(rows) != 0 {
				t.Fatal("claimed during its backoff")
			}
		}
	}
}

func TestReleaseDoesNotCountTheAttempt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := enqueue(t, b, 1)[0]
	rows, err := store.ClaimOutbox(b.ctx, b.pool, "r", 1, time.Minute)
	if err != nil || len(rows) != 1 {
		t.Fatal(err)
	}
	if n, err := store.ReleaseOutboxClaims(b.ctx, b.pool, []store.Claim{rows[0].Claim()}); err != nil || n != 1 {
		t.Fatalf("release: %d, %v", n, err)
	}
	if status, attempts := rowStatus(t, b, id); status != "PENDING" || attempts != 0 {
		t.Fatalf("after release: %s, attempt %d", status, attempts)
	}
}

func TestDeletePublishedOutboxKeepsTheWindow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := enqueue(t, b, 5)
	rows, err := store.ClaimOutbox(b.ctx, b.pool, "r", 5, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	claims := make([]store.Claim, len(rows))
	for i, r := range rows {
		claims[i] = r.Claim()
	}
	if _, err := store.MarkOutboxPublished(b.ctx, b.pool, claims[:4]); err != nil {
		t.Fatal(err)
	}
	// Two were published long ago.
	if _, err := b.pool.Exec(b.ctx, "UPDATE message_outbox SET published_at = now() - interval '8 days' WHERE outbox_id = ANY($1)", ids[:2]); err != nil {
		t.Fatal(err)
	}
	if n, err := store.DeletePublishedOutbox(b.ctx, b.pool, 7*24*time.Hour, 1000); err != nil || n != 2 {
		t.Fatalf("deleted %d, %v", n, err)
	}
	if got := count(t, b.pool, "message_outbox"); got != 3 {
		t.Fatalf("%d rows left, want the 2 recent PUBLISHED and the PUBLISHING one", got)
	}
	stats, err := store.OutboxStats(b.ctx, b.pool)
	if err != nil || len(stats) != 1 || stats[0].Status != "PUBLISHING" || stats[0].Rows != 1 {
		t.Fatalf("stats: %+v, %v", stats, err)
	}
}

func TestDeleteProcessedInboxKeepsTheWindowAndTheFailures(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for i, status := range []string{"PROCESSED", "PROCESSED", "PROCESSED", "POISONED"} {
		entry := store.InboxEntry{Consumer: "c", MessageID: fmt.Sprint("m-", i), Type: "t", Version: 1, PayloadHash: "h"}
		if _, err := store.BeginInbox(b.ctx, b.pool, entry, time.Minute); err != nil {
			t.Fatal(err)
		}
		if status != "PROCESSED" {
			if _, err := b.pool.Exec(b.ctx, "UPDATE message_inbox SET status = $1, outcome = NULL, processed_at = NULL WHERE message_id = $2", status, entry.MessageID); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Two were processed long ago; the poisoned one is old too.
	if _, err := b.pool.Exec(b.ctx, "UPDATE message_inbox SET processed_at = now() - interval '40 days', first_received_at = now() - interval '40 days' WHERE message_id IN ('m-0', 'm-1', 'm-3')"); err != nil {
		t.Fatal(err)
	}
	if n, err := store.DeleteProcessedInbox(b.ctx, b.pool, 30*24*time.Hour, 1000); err != nil || n != 2 {
		t.Fatalf("deleted %d, %v", n, err)
	}
	if got := count(t, b.pool, "message_inbox"); got != 2 {
		t.Fatalf("%d rows left, want the recent PROCESSED one and the POISONED one", got)
	}
}
