package background

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// Retention deletes batch after batch until one comes back short, and
// stops a round at the first error.
func TestRetentionDeletesInBatchesUntilShort(t *testing.T) {
	t.Parallel()
	left := int64(2500)
	var calls []int
	r := Retention{What: "rows", Batch: 1000, Logger: quiet, Delete: func(_ context.Context, limit int) (int64, error) {
		calls = append(calls, limit)
		n := min(left, int64(limit))
		left -= n
		return n, nil
	}}
	if got := r.Once(t.Context()); got != 2500 || len(calls) != 3 {
		t.Fatalf("deleted %d in %d statements, want 2500 in 3", got, len(calls))
	}
	failing := Retention{What: "rows", Logger: quiet, Delete: func(context.Context, int) (int64, error) {
		return 0, errors.New("database away")
	}}
	if got := failing.Once(t.Context()); got != 0 {
		t.Fatalf("a failing round deleted %d", got)
	}
}

// Reconnect runs the session again after it ends, and stops when the
// context ends.
func TestReconnectRunsTheSessionAgainUntilCancelled(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	var runs atomic.Int32
	done := make(chan struct{})
	go func() {
		defer close(done)
		Reconnect{What: "session", Base: time.Millisecond, MaxDelay: 2 * time.Millisecond, Logger: quiet,
			Session: func(ctx context.Context) error {
				if runs.Add(1) == 3 {
					cancel()
					<-ctx.Done()
					return ctx.Err()
				}
				return errors.New("connection refused")
			}}.Run(ctx)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Reconnect did not return after its context ended")
	}
	if got := runs.Load(); got != 3 {
		t.Fatalf("the session ran %d times, want 3", got)
	}
}

// The backoff grows with the attempts, within [d/2, d], and never passes
// the maximum.
func TestBackoffGrowsWithinItsBounds(t *testing.T) {
	t.Parallel()
	for attempt, want := range map[int]time.Duration{1: 100 * time.Millisecond, 2: 200 * time.Millisecond, 3: 400 * time.Millisecond, 10: time.Second} {
		for range 50 {
			got := Backoff(attempt, 100*time.Millisecond, time.Second)
			if got < want/2 || got > want {
				t.Fatalf("Backoff(%d) = %s, want within [%s, %s]", attempt, got, want/2, want)
			}
		}
	}
}
