package inbox_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/yourorg/orders/internal/messaging/inbox"
	"github.com/yourorg/orders/internal/messaging/inbox/inboxadmin"
)

// Retention deletes PROCESSED rows past the window, and keeps every failure.
func TestDeleteProcessedInboxKeepsTheWindowAndTheFailures(t *testing.T) {
	t.Parallel()
	b := setupConsumer(t)
	for i, status := range []string{"PROCESSED", "PROCESSED", "PROCESSED", "POISONED"} {
		entry := inbox.Entry{Consumer: "c", MessageID: fmt.Sprint("m-", i), Type: "t", Version: 1, PayloadHash: "h"}
		if _, err := inbox.Begin(b.ctx, b.pool, entry, time.Minute); err != nil {
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
	if n, err := inboxadmin.DeleteProcessed(b.ctx, b.pool, 30*24*time.Hour, 1000); err != nil || n != 2 {
		t.Fatalf("deleted %d, %v", n, err)
	}
	var left int
	if err := b.pool.QueryRow(b.ctx, "SELECT count(*) FROM message_inbox").Scan(&left); err != nil || left != 2 {
		t.Fatalf("%d rows left (%v), want the recent PROCESSED one and the POISONED one", left, err)
	}
}
