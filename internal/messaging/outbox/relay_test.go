package outbox_test

import (
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/yourorg/orders/internal/messaging"
	"github.com/yourorg/orders/internal/messaging/outbox"
	"github.com/yourorg/orders/internal/messaging/outbox/internal/pipeline"
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

// A claim whose answer is lost after it committed (the connection cut
// during its COMMIT, as when the primary dies or is switched over) leaves
// its rows PUBLISHING under a claim the relay never saw. The relay gives
// them back with its next claim, and publishes them at once, not when
// their lease ends, with the attempt the lost claim counted given back.
func TestAClaimWhoseAnswerIsLostIsGivenBack(t *testing.T) {
	t.Parallel()
	b := setupRelay(t)
	b.BindQueue("observer", "#")
	ids := b.Enqueue(20, messaging.Cause{})
	cfg := outboxtest.Config()
	cfg.Lease = 2 * time.Minute // far beyond the wait below
	var lost atomic.Int32
	started := time.Now()
	b.StartRelay(cfg, b.AMQPURL, outboxtest.AfterClaim(func(rows int) error {
		if lost.Add(1) == 1 {
			return errors.New("connection cut during the claim's COMMIT")
		}
		return nil
	}))

	got := b.Receive("observer", len(ids), 30*time.Second, 0)
	seen := map[string]bool{}
	for _, d := range got {
		seen[d.MessageId] = true
	}
	for _, id := range ids {
		if !seen[id.String()] {
			t.Fatalf("message %s not published within 30s (its lease: %s)", id, cfg.Lease)
		}
	}
	if took := time.Since(started); took > cfg.Lease/4 {
		t.Fatalf("the rows of the lost claim took %s to go out: they waited for their lease", took)
	}
	if lost.Load() < 2 {
		t.Fatalf("%d claims took rows: the first one's answer was to be lost", lost.Load())
	}
	testenv.WaitFor(t, 5*time.Second, "every row to be PUBLISHED", b.AllPublished(len(ids)))
	var attempts int
	if err := b.Pool.QueryRow(b.Ctx, "SELECT max(attempt_count) FROM message_outbox").Scan(&attempts); err != nil || attempts != 1 {
		t.Fatalf("attempt_count at most %d (%v), want 1: the lost claim's attempt is given back", attempts, err)
	}
}

// A mark a failover loses: the relay's marks commit asynchronously, and a
// primary killed moments after one acknowledged it may not have sent it to
// its standby, so the new primary has the rows PUBLISHING under the claim
// that took them, as if no mark had come. Once the relay sees its database
// fail, it gives the rows of the claims it marked within the lease back
// with its next claim: they are published again at once, not when their
// lease ends (with the later rows of their aggregates behind them).
func TestAMarkAFailoverLosesIsGivenBack(t *testing.T) {
	t.Parallel()
	b := setupRelay(t)
	b.BindQueue("observer", "#")
	ids := b.Enqueue(5, messaging.Cause{})
	cfg := outboxtest.Config()
	cfg.Lease = 2 * time.Minute // far beyond the wait below
	faults := &lostMark{}
	b.StartRelay(cfg, b.AMQPURL, faults)
	b.Receive("observer", len(ids), 30*time.Second, 0)
	testenv.WaitFor(t, 5*time.Second, "every row to be PUBLISHED", b.AllPublished(len(ids)))

	// The new primary: the rows as their claim left them, the mark lost.
	for _, c := range faults.marked() {
		if _, err := b.Pool.Exec(b.Ctx, `UPDATE message_outbox SET status = 'PUBLISHING', published_at = NULL,
			claimed_by = $2, claimed_until = now() + interval '2 minutes' WHERE outbox_id = $1`, c.ID, c.Token); err != nil {
			t.Fatal(err)
		}
	}
	// The relay sees the failover: its next claim's answer is lost.
	faults.failNext.Store(true)
	started := time.Now()
	next := b.Enqueue(1, messaging.Cause{})

	got := b.Receive("observer", len(ids)+len(next), 30*time.Second, 0)
	seen := map[string]bool{}
	for _, d := range got {
		seen[d.MessageId] = true
	}
	for _, id := range append(ids, next...) {
		if !seen[id.String()] {
			t.Fatalf("message %s not published again within 30s (its lease: %s)", id, cfg.Lease)
		}
	}
	if took := time.Since(started); took > cfg.Lease/4 {
		t.Fatalf("the rows of the lost marks took %s to go out: they waited for their lease", took)
	}
	testenv.WaitFor(t, 5*time.Second, "every row to be PUBLISHED", b.AllPublished(len(ids)+len(next)))
}

// lostMark is the faults of TestAMarkAFailoverLosesIsGivenBack: it keeps
// the claims of the published rows each mark writes, and loses the
// answer of the next claim once failNext is set.
type lostMark struct {
	mu       sync.Mutex
	claims   []pipeline.Claim
	failNext atomic.Bool
}

func (f *lostMark) BeforeMark(published []pipeline.Claim) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.claims = append(f.claims, published...)
	return nil
}

func (f *lostMark) AfterClaim(int) error {
	if f.failNext.CompareAndSwap(true, false) {
		return errors.New("connection cut: the primary died")
	}
	return nil
}

func (f *lostMark) marked() []pipeline.Claim {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.claims)
}
