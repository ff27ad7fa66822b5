package pipeline

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/yourorg/orders/internal/background"
	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/messaging"
)

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
func (p *Pipeline) Record(ctx context.Context, outcomes []Outcome, write func(context.Context, Marks) (Marked, error)) (Marked, error) {
	var m Marks
	nackWait, recovered := p.cfg.BackoffBase, false
	if slices.ContainsFunc(outcomes, func(o Outcome) bool { return o.Result == ResultNacked }) {
		nackWait = background.Backoff(int(p.refusals.Add(1)), p.cfg.BackoffBase, max(min(p.cfg.BackoffMax, nackWaitMax), p.cfg.BackoffBase))
	} else {
		confirmed := slices.ContainsFunc(outcomes, func(o Outcome) bool { return o.Result == ResultConfirmed })
		recovered = p.refusals.Swap(0) > 0 && confirmed
	}
	type group struct{ typ, result string }
	counts := map[group]int64{} // the counters are added once per type and outcome, not once per row
	for _, o := range outcomes {
		if o.Result != ResultHeld { // not an attempt
			counts[group{o.Row.Type, o.Result}]++
		}
		switch o.Result {
		case ResultConfirmed:
			m.Published = append(m.Published, o.Row.Claim())
		case ResultShutdown, ResultNotPublished:
			m.Released = append(m.Released, PublishFailure{Claim: o.Row.Claim()})
		case ResultHeld:
			m.Released = append(m.Released, PublishFailure{Claim: o.Row.Claim(), Reason: o.Reason})
		case ResultTimeout, ResultConnectionLost:
			m.Released = append(m.Released, PublishFailure{Claim: o.Row.Claim(), Reason: o.Reason, RetryIn: p.cfg.BackoffBase})
		case ResultNacked:
			m.Released = append(m.Released, PublishFailure{Claim: o.Row.Claim(), Reason: o.Reason, RetryIn: nackWait})
		default: // unroutable
			m.Refused = append(m.Refused, PublishFailure{
				Claim: o.Row.Claim(), Reason: o.Reason,
				RetryIn: background.Backoff(o.Row.Attempt, p.cfg.BackoffBase, p.cfg.BackoffMax),
			})
		}
	}
	for g, n := range counts {
		typ := messaging.AttrMessageType.String(g.typ)
		p.metrics.attempts.Add(ctx, n, metric.WithAttributes(typ, messaging.AttrOutcome.String(g.result)))
		switch g.result {
		case ResultUnroutable:
			p.metrics.unroutable.Add(ctx, n, metric.WithAttributes(typ))
		case ResultConfirmed:
			p.metrics.published.Add(ctx, n, metric.WithAttributes(typ))
		}
	}
	if p.cfg.Faults != nil {
		if err := p.cfg.Faults.BeforeMark(m.Published); err != nil {
			p.deps.Crash(err)
			return Marked{}, err
		}
	}

	var marked Marked
	err := p.withDBRetry(ctx, "mark outcomes", func(ctx context.Context) (err error) {
		marked, err = write(ctx, m)
		return err
	})
	for _, o := range outcomes {
		if o.Result == ResultConfirmed {
			p.metrics.publishDelay.Record(ctx, time.Since(o.Row.CreatedAt).Seconds())
			p.metrics.attemptsPerMessage.Record(ctx, int64(o.Row.Attempt))
		}
	}
	p.logFailures(ctx, outcomes)
	if recovered {
		p.bringBackNacked(ctx)
	}
	for _, id := range marked.Failed {
		p.metrics.failed.Add(ctx, 1)
		p.deps.Logger.ErrorContext(ctx, "outbox row FAILED: attempts exhausted", slog.String("message_id", id.String()),
			slog.Int("max_attempts", p.cfg.MaxAttempts))
	}
	return marked, err
}

// bringBackNacked makes the rows the broker nacked, still waiting for
// their next attempt, due now: the broker confirms again, so the wait
// after its nacks ends with its trouble, not at a time set while it
// lasted. On failure the rows keep their time, nackWaitMax at most.
func (p *Pipeline) bringBackNacked(ctx context.Context) {
	if p.deps.Pool == nil {
		return
	}
	var n int64
	ctx, cancel := context.WithTimeout(ctx, p.cfg.DBTimeout)
	defer cancel()
	err := database.RunStatement(ctx, p.deps.Pool, func(ctx context.Context, db database.DBTX) (err error) {
		n, err = queries.BringBackNackedOutbox(ctx, db, reasonNacked)
		return err
	})
	if err != nil {
		p.deps.Logger.WarnContext(ctx, "could not bring back the rows the broker nacked; they wait out their retry time",
			slog.String("error", err.Error()))
		return
	}
	if n > 0 {
		p.deps.Logger.InfoContext(ctx, "RabbitMQ confirms again: the rows it nacked are due now", slog.Int64("rows", n))
	}
}

// Unsettled counts the publish attempt of a row the broker did not answer
// (no confirm in time, the connection lost), for a relay that writes no
// outcome for it: the log-tailing relay publishes it again.
func (p *Pipeline) Unsettled(o Outcome) {
	if o.Result == ResultNotPublished || o.Result == ResultShutdown {
		return // the session was ending anyway
	}
	p.metrics.attempts.Add(context.Background(), 1, metric.WithAttributes(messaging.AttrMessageType.String(o.Row.Type),
		messaging.AttrOutcome.String(o.Result)))
}

// logFailures names each message the broker refused (returned or nacked),
// and sums up in one line the rows a lost connection or a missing confirm
// sent back.
func (p *Pipeline) logFailures(ctx context.Context, outcomes []Outcome) {
	lost := map[string]int{}
	var example Outcome
	for _, o := range outcomes {
		switch o.Result {
		case ResultUnroutable, ResultNacked:
			p.deps.Logger.WarnContext(ctx, "publish refused; will retry", slog.String("message_id", o.Row.ID.String()),
				slog.String("message_type", o.Row.Type), slog.String("aggregate_id", o.Row.AggregateID),
				slog.Int("attempt", o.Row.Attempt), slog.String("reason", o.Reason))
		case ResultTimeout, ResultConnectionLost:
			lost[o.Result]++
			example = o
		}
	}
	for result, n := range lost {
		p.deps.Logger.WarnContext(ctx, "publishes unconfirmed; will retry", slog.String("outcome", result), slog.Int("rows", n),
			slog.String("first_message_id", example.Row.ID.String()), slog.String("reason", example.Reason))
	}
}

// withDBRetry runs f until it succeeds, each try bounded by DBTimeout,
// and returns the last error: while the database is unavailable (a
// failover), again within a second (database.RetryDelay) until the lease
// of the batch's rows ends, after which the mark is moot (the claims'
// tokens fence it) and the rows come back anyway; after any other error,
// five tries at most. It stops early, with ctx's error, when ctx ends.
func (p *Pipeline) withDBRetry(ctx context.Context, what string, f func(context.Context) error) error {
	const tries = 5
	giveUp := time.Now().Add(p.cfg.Lease)
	var err error
	for attempt := 1; ; attempt++ {
		tryCtx, cancel := context.WithTimeout(ctx, p.cfg.DBTimeout)
		err = f(tryCtx)
		cancel()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%s: %w (%w)", what, ctx.Err(), err)
		}
		p.deps.Logger.WarnContext(ctx, what+": failed", slog.String("error", err.Error()), slog.Int("attempt", attempt))
		outage := database.IsUnavailable(err) && time.Now().Before(giveUp)
		if !outage && attempt >= tries || !background.Sleep(ctx, database.RetryDelay(attempt, err, 5*time.Second)) {
			return fmt.Errorf("%s: %w", what, err)
		}
	}
}
