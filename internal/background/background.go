// Package background holds the loops the processes run beside their main
// work, each a small named piece with one job, in the spirit of river's
// maintenance services:
//
//   - Backoff and Sleep: the wait between two tries of anything;
//   - Reconnect: run a session (a broker connection, a LISTEN connection)
//     again and again, with growing waits while it keeps failing;
//   - Retention: delete old rows in batches, every so often (the outbox's
//     PUBLISHED rows, the inbox's PROCESSED rows, expired HTTP idempotency
//     keys).
//
// None of them knows what it runs: the outbox, the inbox and order-api hand
// them functions.
package background

import (
	"cmp"
	"context"
	"log/slog"
	"math/rand/v2"
	"time"
)

// Backoff is an exponential backoff with jitter: attempt 1 waits about
// base, each next attempt about twice as long, never more than maxDelay.
// The jitter (a random half of the delay) keeps many failing rows or
// processes from retrying in step.
func Backoff(attempt int, base, maxDelay time.Duration) time.Duration {
	d := base
	for i := 1; i < attempt && d < maxDelay; i++ {
		d *= 2
	}
	d = min(d, maxDelay)
	half := d / 2
	return half + rand.N(half+1)
}

// Sleep waits d or until ctx ends, and reports whether the full d passed.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// Reconnect runs session until ctx ends, starting it again after each
// return. The wait between two runs grows while sessions keep failing
// fast (base, doubling, at most maxDelay), and starts over once a session
// has run for a minute. Each restart is logged as a warning that names
// what (for example "broker session") and the error.
type Reconnect struct {
	What            string        // what is reconnected, for the log
	Base, MaxDelay  time.Duration // the backoff between runs
	Logger          *slog.Logger
	Session         func(ctx context.Context) error
	healthyAfterRun time.Duration // 0: a minute (tests shorten it)
}

// Run runs the sessions until ctx ends.
func (r Reconnect) Run(ctx context.Context) {
	healthy := r.healthyAfterRun
	if healthy == 0 {
		healthy = time.Minute
	}
	for failures := 0; ; {
		started := time.Now()
		err := r.Session(ctx)
		if ctx.Err() != nil {
			return
		}
		if time.Since(started) > healthy {
			failures = 0 // it ran a good while: start the backoff over
		}
		failures++
		delay := Backoff(failures, r.Base, r.MaxDelay)
		msg := "<nil>"
		if err != nil {
			msg = err.Error()
		}
		r.Logger.WarnContext(ctx, r.What+" ended; reconnecting", slog.String("error", msg), slog.Duration("retry_in", delay))
		Sleep(ctx, delay)
	}
}

// Retention deletes old rows every Interval, Batch rows per statement
// until a statement deletes fewer, so that no statement holds many locks
// or runs long. Delete deletes at most limit rows and says how many.
type Retention struct {
	What     string        // the rows, for the log ("published outbox rows")
	Interval time.Duration // default a minute
	Batch    int           // default 1000
	Logger   *slog.Logger
	Delete   func(ctx context.Context, limit int) (int64, error)
}

// Run deletes until ctx ends.
func (r Retention) Run(ctx context.Context) {
	t := time.NewTicker(cmp.Or(r.Interval, time.Minute))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			r.Once(ctx)
		}
	}
}

// Once deletes everything due now, a batch at a time, and says how many
// rows it deleted. A failure is logged and ends this round; the next
// round tries again.
func (r Retention) Once(ctx context.Context) int64 {
	batch := cmp.Or(r.Batch, 1000)
	var total int64
	for {
		n, err := r.Delete(ctx, batch)
		total += n
		if err != nil {
			if ctx.Err() == nil {
				r.Logger.WarnContext(ctx, "deleting "+r.What+" failed", slog.String("error", err.Error()))
			}
			return total
		}
		if n < int64(batch) {
			if total > 0 {
				r.Logger.DebugContext(ctx, "deleted "+r.What, slog.Int64("rows", total))
			}
			return total
		}
	}
}
