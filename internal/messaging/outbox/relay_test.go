package outbox_test

import (
	"testing"
	"time"

	"github.com/yourorg/orders/internal/messaging"
	"github.com/yourorg/orders/internal/messaging/outbox"
	"github.com/yourorg/orders/internal/messaging/outbox/outboxtest"
	"github.com/yourorg/orders/internal/testenv"
)

// The relay's contract (package outboxtest), against the polling relay.
// Package wal runs it against the log-tailing relay.
func TestRelay(t *testing.T) { outboxtest.Run(t, outboxtest.Poll) }

func setupRelay(t testing.TB) *outboxtest.Bundle {
	t.Helper()
	return outboxtest.Setup(t, outboxtest.Poll)
}

// A claimed row whose relay vanished (no process will ever mark it)
// becomes claimable when its lease ends, and is published.
func TestVanishedRelaysRowsComeBackAfterTheLease(t *testing.T) {
	t.Parallel()
	b := setupRelay(t)
	b.BindQueue("observer", "#")
	ids := b.Enqueue(4, messaging.Cause{})
	claimed, err := outbox.ClaimRows(b.Ctx, b.Pool, "ghost-relay", 10, time.Second)
	if err != nil || len(claimed) != 4 {
		t.Fatalf("ghost claim: %d rows, %v", len(claimed), err)
	}
	b.StartRelay(outboxtest.Config(), b.AMQPURL, nil)

	got := b.Receive("observer", 4, 15*time.Second, 0)
	seen := map[string]bool{}
	for _, d := range got {
		seen[d.MessageId] = true
	}
	if len(seen) != len(ids) {
		t.Fatalf("received %d", len(got))
	}
	testenv.WaitFor(t, 5*time.Second, "every row to be PUBLISHED", b.AllPublished(4))
	var attempts int
	_ = b.Pool.QueryRow(b.Ctx, "SELECT min(attempt_count) FROM message_outbox").Scan(&attempts)
	if attempts != 1 {
		t.Fatalf("attempt_count = %d, want 1: ours (the ghost's was given back with its lease)", attempts)
	}
	if got := b.Counter("outbox.lease.recovered"); got != 4 {
		t.Fatalf("outbox.lease.recovered = %d", got)
	}
}
