package outbox_test

import (
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/yourorg/orders/internal/messaging"
	"github.com/yourorg/orders/internal/messaging/outbox"
	"github.com/yourorg/orders/internal/messaging/outbox/outboxtest"
)

func enqueue(t *testing.T, b *outboxtest.Bundle, n int) []uuid.UUID {
	t.Helper()
	msgs := make([]messaging.Message, n)
	for i := range msgs {
		msgs[i] = outboxtest.Message{Type: outboxtest.TypeCancelled, ID: uuid.New()}
	}
	ids, err := outboxtest.Writer.Write(b.Ctx, b.Pool, messaging.Cause{}, msgs...)
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

func rowStatus(t *testing.T, b *outboxtest.Bundle, id uuid.UUID) (status string, attempts int) {
	t.Helper()
	if err := b.Pool.QueryRow(b.Ctx, "SELECT status, attempt_count FROM message_outbox WHERE outbox_id = $1", id).Scan(&status, &attempts); err != nil {
		t.Fatal(err)
	}
	return status, attempts
}

// Claims are oldest first, disjoint, and a mark only touches the claim it
// names: a relay that lost its lease cannot overwrite a newer claim.
func TestClaimAndMarkAreFencedByTheClaim(t *testing.T) {
	t.Parallel()
	b := setupRelay(t)
	ids := enqueue(t, b, 3)

	first, err := outbox.ClaimRows(b.Ctx, b.Pool, "relay-a", 2, time.Minute)
	if err != nil || len(first) != 2 || first[0].ID != ids[0] || first[1].ID != ids[1] || first[0].Attempt != 1 {
		t.Fatalf("first claim: %+v, %v", first, err)
	}
	second, err := outbox.ClaimRows(b.Ctx, b.Pool, "relay-b", 10, time.Minute)
	if err != nil || len(second) != 1 || second[0].ID != ids[2] {
		t.Fatalf("second claim overlaps: %+v, %v", second, err)
	}

	// relay-a's lease on ids[0] ends; the row is recovered, with the attempt
	// given back (a relay's death is not the message's fault), and claimed
	// again.
	if _, err := b.Pool.Exec(b.Ctx, "UPDATE message_outbox SET claimed_until = now() - interval '1s' WHERE outbox_id = $1", ids[0]); err != nil {
		t.Fatal(err)
	}
	if recovered, err := outbox.RecoverExpiredClaims(b.Ctx, b.Pool); err != nil || len(recovered) != 1 || recovered[0] != ids[0] {
		t.Fatalf("recovered %v, %v", recovered, err)
	}
	if status, attempts := rowStatus(t, b, ids[0]); status != "PENDING" || attempts != 0 {
		t.Fatalf("recovered row: %s attempt %d, want PENDING with no attempt spent", status, attempts)
	}
	// The same relay claims it again: a claim of its own, with a token of its own.
	again, err := outbox.ClaimRows(b.Ctx, b.Pool, "relay-a", 10, time.Minute)
	if err != nil || len(again) != 1 || again[0].ID != ids[0] || again[0].Attempt != 1 || again[0].ClaimToken == first[0].ClaimToken {
		t.Fatalf("reclaim: %+v, %v", again, err)
	}
	// relay-a's old claim, late, marks the row: nothing happens.
	if n, err := outbox.MarkPublished(b.Ctx, b.Pool, []outbox.Claim{first[0].Claim()}); err != nil || n != 0 {
		t.Fatalf("stale mark touched %d rows, %v", n, err)
	}
	if _, err := outbox.MarkFailed(b.Ctx, b.Pool, []outbox.PublishFailure{{Claim: first[0].Claim(), Reason: "late"}}, 10); err != nil {
		t.Fatal(err)
	}
	if status, attempts := rowStatus(t, b, ids[0]); status != "PUBLISHING" || attempts != 1 {
		t.Fatalf("row after stale marks: %s attempt %d", status, attempts)
	}
	// The current claim marks it.
	if n, err := outbox.MarkPublished(b.Ctx, b.Pool, []outbox.Claim{again[0].Claim()}); err != nil || n != 1 {
		t.Fatalf("mark: %d, %v", n, err)
	}
}

func TestMarkFailedBacksOffThenFails(t *testing.T) {
	t.Parallel()
	b := setupRelay(t)
	id := enqueue(t, b, 1)[0]
	for attempt := 1; attempt <= 3; attempt++ {
		if _, err := b.Pool.Exec(b.Ctx, "UPDATE message_outbox SET next_attempt_at = now()"); err != nil {
			t.Fatal(err)
		}
		rows, err := outbox.ClaimRows(b.Ctx, b.Pool, "r", 1, time.Minute)
		if err != nil || len(rows) != 1 {
			t.Fatalf("attempt %d: claim %v, %v", attempt, rows, err)
		}
		failed, err := outbox.MarkFailed(b.Ctx, b.Pool, []outbox.PublishFailure{{Claim: rows[0].Claim(), Reason: "unroutable", RetryIn: time.Hour}}, 3)
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
			if rows, _ := outbox.ClaimRows(b.Ctx, b.Pool, "r", 1, time.Minute); len(rows) != 0 {
				t.Fatal("claimed during its backoff")
			}
		}
	}
}

func TestReleaseDoesNotCountTheAttempt(t *testing.T) {
	t.Parallel()
	b := setupRelay(t)
	id := enqueue(t, b, 1)[0]
	rows, err := outbox.ClaimRows(b.Ctx, b.Pool, "r", 1, time.Minute)
	if err != nil || len(rows) != 1 {
		t.Fatal(err)
	}
	release := []outbox.PublishFailure{{Claim: rows[0].Claim(), Reason: "connection to RabbitMQ lost before the confirm"}}
	if n, err := outbox.ReleaseClaims(b.Ctx, b.Pool, release); err != nil || n != 1 {
		t.Fatalf("release: %d, %v", n, err)
	}
	var lastError string
	if err := b.Pool.QueryRow(b.Ctx, "SELECT last_error FROM message_outbox WHERE outbox_id = $1", id).Scan(&lastError); err != nil || lastError != release[0].Reason {
		t.Fatalf("last_error %q (%v), want the reason", lastError, err)
	}
	if status, attempts := rowStatus(t, b, id); status != "PENDING" || attempts != 0 {
		t.Fatalf("after release: %s, attempt %d", status, attempts)
	}

	// The row is claimed again: attempt 1 again, as the first claim was. A
	// retry of the first release (its answer lost, say) must not hand back
	// the new claim: the token fences it, where the attempt alone could not.
	again, err := outbox.ClaimRows(b.Ctx, b.Pool, "r", 1, time.Minute)
	if err != nil || len(again) != 1 || again[0].Attempt != rows[0].Attempt {
		t.Fatalf("reclaim: %+v, %v", again, err)
	}
	if n, err := outbox.ReleaseClaims(b.Ctx, b.Pool, release); err != nil || n != 0 {
		t.Fatalf("a retried release touched %d rows of a newer claim (%v)", n, err)
	}
	if status, attempts := rowStatus(t, b, id); status != "PUBLISHING" || attempts != 1 {
		t.Fatalf("after the retried release: %s, attempt %d; want the new claim intact", status, attempts)
	}
}

// The sweep's claim (created_before set) takes the rows written before its
// cutoff, and the later ones whose last publish failed, oldest first across
// both (its two scans, 00016), and leaves the other later ones to the log
// stream.
func TestSweepClaimsRowsBeforeTheCutoffAndFailedOnes(t *testing.T) {
	t.Parallel()
	b := setupRelay(t)
	ids := enqueue(t, b, 4)
	var cutoff time.Time
	if err := b.Pool.QueryRow(b.Ctx, "SELECT created_at FROM message_outbox WHERE outbox_id = $1", ids[2]).Scan(&cutoff); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Pool.Exec(b.Ctx, "UPDATE message_outbox SET last_error = 'unroutable' WHERE outbox_id = $1", ids[3]); err != nil {
		t.Fatal(err)
	}

	first, err := outbox.ClaimRowsBefore(b.Ctx, b.Pool, "sweep", 2, time.Minute, cutoff)
	if err != nil || len(first) != 2 || first[0].ID != ids[0] || first[1].ID != ids[1] {
		t.Fatalf("first sweep claim: %+v, %v; want %v", first, err, ids[:2])
	}
	second, err := outbox.ClaimRowsBefore(b.Ctx, b.Pool, "sweep", 10, time.Minute, cutoff)
	if err != nil || len(second) != 1 || second[0].ID != ids[3] {
		t.Fatalf("second sweep claim: %+v, %v; want only the failed row %v", second, err, ids[3])
	}
	if status, _ := rowStatus(t, b, ids[2]); status != "PENDING" {
		t.Fatalf("the stream's row %v is %s, want PENDING", ids[2], status)
	}
}
