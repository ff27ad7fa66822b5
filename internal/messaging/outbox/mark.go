package outbox

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/google/uuid"

	"github.com/yourorg/orders/internal/background"
	"github.com/yourorg/orders/internal/messaging"
)

// mark writes the outcomes of a batch to the database, one statement each
// for the published rows, the refused ones and those handed back:
//
//   - confirmed: PUBLISHED;
//   - returned (unroutable) or nacked, a cause that belongs to the message:
//     back to PENDING after a backoff, the attempt counted, FAILED after
//     the last one;
//   - cut short by the infrastructure (the connection lost, no confirm in
//     time) or never published (shutdown): back to PENDING with the
//     attempt not counted, so broker trouble never spends a row's attempts.
//
// Each statement is fenced by the claim's token and retried on its own, so
// a retry never repeats a statement that took effect.
func (r *Relay) mark(outcomes []outcome) error {
	var (
		published []Claim
		refused   []PublishFailure
		released  []PublishFailure
	)
	ctx := context.Background()
	for _, o := range outcomes {
		attrs := metric.WithAttributes(messaging.AttrMessageType.String(o.row.Type), messaging.AttrOutcome.String(o.result))
		r.metrics.attempts.Add(ctx, 1, attrs)
		switch o.result {
		case outcomeConfirmed:
			published = append(published, o.row.Claim())
		case outcomeShutdown, outcomeNotPublished:
			released = append(released, PublishFailure{Claim: o.row.Claim()})
		case outcomeTimeout, outcomeConnectionLost:
			released = append(released, PublishFailure{Claim: o.row.Claim(), Reason: o.reason, RetryIn: r.cfg.BackoffBase})
		default: // unroutable, nacked
			if o.result == outcomeUnroutable {
				r.metrics.unroutable.Add(ctx, 1, metric.WithAttributes(messaging.AttrMessageType.String(o.row.Type)))
			}
			refused = append(refused, PublishFailure{
				Claim: o.row.Claim(), Reason: o.reason,
				RetryIn: background.Backoff(o.row.Attempt, r.cfg.BackoffBase, r.cfg.BackoffMax),
			})
		}
	}
	if r.beforeMark != nil {
		if err := r.beforeMark(published); err != nil {
			return fmt.Errorf("%w: %w", errStopped, err)
		}
	}

	var marked int64
	r.withDBRetry("mark published", func(ctx context.Context) (err error) {
		marked, err = MarkPublished(ctx, r.pool, published)
		return err
	})
	if lost := int64(len(published)) - marked; lost > 0 {
		r.log.WarnContext(ctx, "confirmed rows not marked (lease expired, or the database away); they will be published again",
			slog.Int64("rows", lost))
	}
	for _, o := range outcomes {
		if o.result == outcomeConfirmed {
			r.metrics.published.Add(ctx, 1, metric.WithAttributes(messaging.AttrMessageType.String(o.row.Type)))
			r.metrics.publishDelay.Record(ctx, time.Since(o.row.CreatedAt).Seconds())
			r.metrics.attemptsPerMessage.Record(ctx, int64(o.row.Attempt))
		}
	}
	var failedIDs []uuid.UUID
	r.withDBRetry("mark refused", func(ctx context.Context) (err error) {
		failedIDs, err = MarkFailed(ctx, r.pool, refused, r.cfg.MaxAttempts)
		return err
	})
	r.logFailures(ctx, outcomes)
	for _, id := range failedIDs {
		r.metrics.failed.Add(ctx, 1)
		r.log.ErrorContext(ctx, "outbox row FAILED: attempts exhausted", slog.String("message_id", id.String()),
			slog.Int("max_attempts", r.cfg.MaxAttempts))
	}
	r.withDBRetry("release claims", func(ctx context.Context) error {
		_, err := ReleaseClaims(ctx, r.pool, released)
		return err
	})
	return nil
}

// logFailures names each message the broker refused (returned or nacked:
// something about that message), and sums up in one line the rows a lost
// connection or a missing confirm sent back (something about the broker).
func (r *Relay) logFailures(ctx context.Context, outcomes []outcome) {
	lost := map[string]int{}
	var example outcome
	for _, o := range outcomes {
		switch o.result {
		case outcomeUnroutable, outcomeNacked:
			r.log.WarnContext(ctx, "publish refused; will retry", slog.String("message_id", o.row.ID.String()),
				slog.String("message_type", o.row.Type), slog.String("aggregate_id", o.row.AggregateID),
				slog.Int("attempt", o.row.Attempt), slog.String("reason", o.reason))
		case outcomeTimeout, outcomeConnectionLost:
			lost[o.result]++
			example = o
		}
	}
	for result, n := range lost {
		r.log.WarnContext(ctx, "publishes unconfirmed; will retry", slog.String("outcome", result), slog.Int("rows", n),
			slog.String("first_message_id", example.row.ID.String()), slog.String("reason", example.reason))
	}
}

// withDBRetry runs f until it succeeds, a few times with backoff, each
// try bounded by RELAY_DB_TIMEOUT. If the database stays away, the rows stay
// PUBLISHING and come back when their lease ends: published again (a
// duplicate the inbox absorbs), never lost.
func (r *Relay) withDBRetry(what string, f func(context.Context) error) {
	var err error
	for attempt := 1; attempt <= 5; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), r.cfg.DBTimeout)
		err = f(ctx)
		cancel()
		if err == nil {
			return
		}
		r.log.Warn(what+": failed", slog.String("error", err.Error()), slog.Int("attempt", attempt))
		time.Sleep(background.Backoff(attempt, 200*time.Millisecond, 5*time.Second))
	}
	r.log.Error(what+": giving up; the leases will bring the rows back", slog.String("error", err.Error()))
}
