package outbox

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/jackc/pgx/v5"

	"github.com/yourorg/orders/internal/background"
	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/messaging"
)

// mark records the outcomes of a claimed batch (Record) and writes them
// with markRows: one statement and one commit per batch, whatever the mix,
// with the pool's settings in force behind a pooler too
// (database.RunStatement). The statement is fenced by the claims' tokens and takes effect whole or
// not at all, so its retries never repeat a change that took effect. If
// the database stays away, the rows stay PUBLISHING and come back when
// their lease ends: published again (a duplicate the inbox absorbs), never
// lost.
func (r *Relay) mark(ctx context.Context, outcomes []Outcome) error {
	marked, err := r.Record(ctx, outcomes, func(ctx context.Context, m Marks) (Marked, error) {
		var marked Marked
		err := database.RunStatement(ctx, r.pool, func(ctx context.Context, db database.DBTX) (err error) {
			marked, err = markRows(ctx, db, m, r.cfg.MaxAttempts)
			return err
		})
		return marked, err
	})
	if ctx.Err() != nil {
		return err // a crash (Config.Faults): nothing more is marked
	}
	if err != nil {
		r.log.ErrorContext(ctx, "marking outcomes: giving up; the leases will bring the rows back", slog.String("error", err.Error()))
	}
	confirmed := int64(0)
	for _, o := range outcomes {
		if o.Result == outcomeConfirmed {
			confirmed++
		}
	}
	if lost := confirmed - marked.Published; lost > 0 {
		r.log.WarnContext(ctx, "confirmed rows not marked (lease expired, or the database away); they will be published again",
			slog.Int64("rows", lost))
	}
	return nil
}

// nackWaitMax bounds the wait after a nack. A nack is the broker's trouble
// (a quorum queue electing a leader after a node died), which passes in
// seconds however many batches it refused meanwhile: a wait that kept
// growing with them pushed rows minutes past the broker's recovery.
const nackWaitMax = 5 * time.Second

// Record is the last step of every batch, whatever the rows' source: it
// counts the outcomes, sorts them into marks and writes those with write,
// retried (withDBRetry) until ctx ends:
//
//   - confirmed: PUBLISHED;
//   - returned (unroutable: no queue matched its routing key), the one
//     cause that belongs to the message: back to PENDING after a backoff,
//     the attempt counted, FAILED after the last one;
//   - nacked by the broker (a quorum queue without a leader, a full queue
//     rejecting publishes, an internal error): back to PENDING with the
//     attempt not counted, after a wait that grows with the batches the
//     broker nacked in a row, up to nackWaitMax, and cut short as soon as
//     the broker confirms again (bringBackNacked);
//   - cut short by the infrastructure (the connection lost, no confirm in
//     time), never published (shutdown) or held (a reader's queue
//     missing): back to PENDING with the attempt not counted.
//
// So broker trouble never spends a row's attempts: only a return does.
func (r *Relay) Record(ctx context.Context, outcomes []Outcome, write func(context.Context, Marks) (Marked, error)) (Marked, error) {
	var m Marks
	nackWait, recovered := r.cfg.BackoffBase, false
	if slices.ContainsFunc(outcomes, func(o Outcome) bool { return o.Result == outcomeNacked }) {
		nackWait = background.Backoff(int(r.refusals.Add(1)), r.cfg.BackoffBase, max(min(r.cfg.BackoffMax, nackWaitMax), r.cfg.BackoffBase))
	} else {
		confirmed := slices.ContainsFunc(outcomes, func(o Outcome) bool { return o.Result == outcomeConfirmed })
		recovered = r.refusals.Swap(0) > 0 && confirmed
	}
	type group struct{ typ, result string }
	counts := map[group]int64{} // the counters are added once per type and outcome, not once per row
	for _, o := range outcomes {
		if o.Result != outcomeHeld { // not an attempt
			counts[group{o.Row.Type, o.Result}]++
		}
		switch o.Result {
		case outcomeConfirmed:
			m.Published = append(m.Published, o.Row.Claim())
		case outcomeShutdown, outcomeNotPublished:
			m.Released = append(m.Released, PublishFailure{Claim: o.Row.Claim()})
		case outcomeHeld:
			m.Released = append(m.Released, PublishFailure{Claim: o.Row.Claim(), Reason: o.Reason})
		case outcomeTimeout, outcomeConnectionLost:
			m.Released = append(m.Released, PublishFailure{Claim: o.Row.Claim(), Reason: o.Reason, RetryIn: r.cfg.BackoffBase})
		case outcomeNacked:
			m.Released = append(m.Released, PublishFailure{Claim: o.Row.Claim(), Reason: o.Reason, RetryIn: nackWait})
		default: // unroutable
			m.Refused = append(m.Refused, PublishFailure{
				Claim: o.Row.Claim(), Reason: o.Reason,
				RetryIn: background.Backoff(o.Row.Attempt, r.cfg.BackoffBase, r.cfg.BackoffMax),
			})
		}
	}
	for g, n := range counts {
		typ := messaging.AttrMessageType.String(g.typ)
		r.metrics.attempts.Add(ctx, n, metric.WithAttributes(typ, messaging.AttrOutcome.String(g.result)))
		switch g.result {
		case outcomeUnroutable:
			r.metrics.unroutable.Add(ctx, n, metric.WithAttributes(typ))
		case outcomeConfirmed:
			r.metrics.published.Add(ctx, n, metric.WithAttributes(typ))
		}
	}
	if r.cfg.Faults != nil {
		if err := r.cfg.Faults.BeforeMark(m.Published); err != nil {
			r.crash(err)
			return Marked{}, err
		}
	}

	var marked Marked
	err := r.withDBRetry(ctx, "mark outcomes", func(ctx context.Context) (err error) {
		marked, err = write(ctx, m)
		return err
	})
	for _, o := range outcomes {
		if o.Result == outcomeConfirmed {
			r.metrics.publishDelay.Record(ctx, time.Since(o.Row.CreatedAt).Seconds())
			r.metrics.attemptsPerMessage.Record(ctx, int64(o.Row.Attempt))
		}
	}
	r.logFailures(ctx, outcomes)
	if recovered {
		r.bringBackNacked(ctx)
	}
	for _, id := range marked.Failed {
		r.metrics.failed.Add(ctx, 1)
		r.log.ErrorContext(ctx, "outbox row FAILED: attempts exhausted", slog.String("message_id", id.String()),
			slog.Int("max_attempts", r.cfg.MaxAttempts))
	}
	return marked, err
}

// bringBackNacked makes the rows the broker nacked, still waiting for
// their next attempt, due now: the broker confirms again, so the wait
// after its nacks ends with its trouble, not at a time set while it
// lasted. On failure the rows keep their time, nackWaitMax at most.
func (r *Relay) bringBackNacked(ctx context.Context) {
	if r.pool == nil {
		return
	}
	var n int64
	err := database.Run(ctx, r.pool, database.Policy{Timeout: r.cfg.DBTimeout}, func(ctx context.Context, tx pgx.Tx) (err error) {
		n, err = queries.BringBackNackedOutbox(ctx, tx, reasonNacked)
		return err
	})
	if err != nil {
		r.log.WarnContext(ctx, "could not bring back the rows the broker nacked; they wait out their retry time",
			slog.String("error", err.Error()))
		return
	}
	if n > 0 {
		r.log.InfoContext(ctx, "RabbitMQ confirms again: the rows it nacked are due now", slog.Int64("rows", n))
	}
}

// Unsettled counts the publish attempt of a row the broker did not answer
// (no confirm in time, the connection lost), for a relay that writes no
// outcome for it: the log-tailing relay publishes it again.
func (r *Relay) Unsettled(o Outcome) {
	if o.Result == outcomeNotPublished || o.Result == outcomeShutdown {
		return // the session was ending anyway
	}
	r.metrics.attempts.Add(context.Background(), 1, metric.WithAttributes(messaging.AttrMessageType.String(o.Row.Type),
		messaging.AttrOutcome.String(o.Result)))
}

// logFailures names each message the broker refused (returned or nacked),
// and sums up in one line the rows a lost connection or a missing confirm
// sent back.
func (r *Relay) logFailures(ctx context.Context, outcomes []Outcome) {
	lost := map[string]int{}
	var example Outcome
	for _, o := range outcomes {
		switch o.Result {
		case outcomeUnroutable, outcomeNacked:
			r.log.WarnContext(ctx, "publish refused; will retry", slog.String("message_id", o.Row.ID.String()),
				slog.String("message_type", o.Row.Type), slog.String("aggregate_id", o.Row.AggregateID),
				slog.Int("attempt", o.Row.Attempt), slog.String("reason", o.Reason))
		case outcomeTimeout, outcomeConnectionLost:
			lost[o.Result]++
			example = o
		}
	}
	for result, n := range lost {
		r.log.WarnContext(ctx, "publishes unconfirmed; will retry", slog.String("outcome", result), slog.Int("rows", n),
			slog.String("first_message_id", example.Row.ID.String()), slog.String("reason", example.Reason))
	}
}

// withDBRetry runs f until it succeeds, at most five times with backoff,
// each try bounded by DBTimeout, and returns the last error. It stops
// early, with ctx's error, when ctx ends.
func (r *Relay) withDBRetry(ctx context.Context, what string, f func(context.Context) error) error {
	const tries = 5
	var err error
	for attempt := 1; ; attempt++ {
		tryCtx, cancel := context.WithTimeout(ctx, r.cfg.DBTimeout)
		err = f(tryCtx)
		cancel()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%s: %w (%w)", what, ctx.Err(), err)
		}
		r.log.WarnContext(ctx, what+": failed", slog.String("error", err.Error()), slog.Int("attempt", attempt))
		if attempt == tries || !background.Sleep(ctx, background.Backoff(attempt, 200*time.Millisecond, 5*time.Second)) {
			return fmt.Errorf("%s: %w", what, err)
		}
	}
}
