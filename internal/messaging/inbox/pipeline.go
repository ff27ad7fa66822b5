package inbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/metric"

	"github.com/yourorg/orders/internal/background"
	"github.com/yourorg/orders/internal/messaging"
	"github.com/yourorg/orders/internal/telemetry"
)

// result is what became of one delivery.
type result struct {
	outcome string // processed, ignored, duplicate, busy
	reason  string
}

// handle is the delivery wrapper, the same for every consumer:
//
//	validate the envelope -> BEGIN -> inbox row (insert, or find) ->
//	handler -> follow-up outbox rows -> inbox PROCESSED -> COMMIT -> ack
//
// and, when anything fails, classify the failure, record it on the inbox
// row, and retry later or park, acknowledging only once the message is
// safely somewhere else.
func (c *loop) handle(ctx context.Context, pub *confirmPublisher, raw amqp.Delivery) {
	start := time.Now()
	ctx, span := processSpan(ctx, c.tracer, raw, QueueName(c.def.name), c.def.name)
	defer span.End()
	d, err := parseDelivery(raw)
	if sc := span.SpanContext(); sc.IsValid() {
		d.TraceID = sc.TraceID().String() // every inbox row names its trace
	}
	attrs := metric.WithAttributes(attrConsumer.String(c.def.name), messaging.AttrMessageType.String(d.Type))
	c.metrics.received.Add(ctx, 1, attrs)
	if raw.Redelivered {
		c.metrics.redelivered.Add(ctx, 1, attrs)
	}
	ctx = telemetry.WithLogAttrs(ctx, slog.String("message_id", d.MessageID),
		slog.String("message_type", d.Type), slog.String("correlation_id", d.CorrelationID), slog.String("order_id", d.OrderID()),
		slog.Int("attempt", d.Attempt), slog.Bool("redelivered", raw.Redelivered))
	var h handler
	if err == nil {
		h, err = c.def.handlerOf(d)
	}
	var res result
	if err == nil {
		res, err = c.apply(ctx, d, h)
	}
	if err != nil {
		c.fail(ctx, pub, raw, d, err, start)
		return
	}
	if res.outcome == "busy" { // another delivery holds the message: look again later
		c.retryLater(ctx, pub, raw, d, d.Attempt, "busy", res.reason, start)
		return
	}
	if c.afterCommit != nil {
		c.afterCommit(d)
	}
	if armed := c.crashAfterCommit.Load(); armed != nil && *armed == d.Type && c.crashAfterCommit.CompareAndSwap(armed, nil) {
		c.log.ErrorContext(ctx, "fault injection: exiting after the commit, before the ack")
		c.exit(3)
		return
	}
	if err := raw.Ack(false); err != nil {
		// The channel is gone; the broker delivers the message again, and
		// the inbox row makes that delivery a duplicate.
		c.log.WarnContext(ctx, "ack failed after commit; the redelivery will be a duplicate", slog.String("error", err.Error()))
		return
	}
	took := time.Since(start)
	c.metrics.duration.Record(ctx, took.Seconds(), metric.WithAttributes(attrConsumer.String(c.def.name), messaging.AttrOutcome.String(res.outcome)))
	span.SetAttributes(messaging.AttrOutcome.String(res.outcome))
	logAttrs := []any{slog.String("outcome", res.outcome), slog.Duration("took", took)}
	if res.reason != "" {
		logAttrs = append(logAttrs, slog.String("reason", res.reason))
	}
	switch res.outcome {
	case "duplicate":
		c.metrics.duplicates.Add(ctx, 1, attrs)
		c.log.InfoContext(ctx, "duplicate acknowledged", logAttrs...)
	default:
		c.metrics.processed.Add(ctx, 1, metric.WithAttributes(attrConsumer.String(c.def.name), messaging.AttrMessageType.String(d.Type), messaging.AttrOutcome.String(res.outcome)))
		c.log.InfoContext(ctx, "message "+res.outcome, logAttrs...)
	}
}

// apply runs the transaction(s) of one delivery. A transaction that loses a
// serialization failure or a deadlock is run again at once, a few times,
// before the failure counts.
func (c *loop) apply(ctx context.Context, d *Delivery, h handler) (res result, err error) {
	// A handler that panics is a bug no retry fixes: park the message (the
	// transaction has rolled back) and keep the process and its other
	// deliveries running.
	defer func() {
		if r := recover(); r != nil {
			c.log.ErrorContext(ctx, "handler panicked", slog.Any("panic", r), slog.String("stack", string(debug.Stack())))
			err = Permanent("handler_panic", fmt.Errorf("the handler panicked: %v", r))
		}
	}()
	var external *External
	err = retryTx(ctx, func() error {
		var err error
		res, external, err = c.firstStep(ctx, d, h)
		return err
	})
	if err != nil || external == nil {
		return res, err
	}

	// The two-step shape: the intent is committed, the row still PROCESSING.
	callErr := external.Call(ctx)
	err = retryTx(ctx, func() error {
		return c.inTx(ctx, func(tx pgx.Tx) error {
			if err := external.Record(ctx, tx, callErr); err != nil {
				return err
			}
			if callErr != nil {
				return nil
			}
			return MarkProcessed(ctx, tx, c.def.name, d.MessageID, OutcomeApplied, "")
		})
	})
	if err != nil {
		return res, err
	}
	if callErr != nil {
		return res, callErr
	}
	return result{outcome: "processed"}, nil
}

// firstStep is the transaction of the effect: inbox row, handler, outbox,
// PROCESSED.
func (c *loop) firstStep(ctx context.Context, d *Delivery, h handler) (result, *External, error) {
	var (
		res         result
		external    *External
		afterCommit func(context.Context)
	)
	err := c.inTx(ctx, func(tx pgx.Tx) error {
		decision, err := Begin(ctx, tx, d.inboxEntry(c.def.name), c.cfg.ProcessingLease)
		if err != nil {
			return err
		}
		switch {
		case decision.Duplicate:
			res = result{outcome: "duplicate", reason: "already processed"}
			if decision.PayloadMismatch {
				res.reason = "already processed; this delivery's body differs (a producer reused the message_id)"
				c.metrics.payloadMismatch.Add(ctx, 1, metric.WithAttributes(attrConsumer.String(c.def.name)))
			}
			return nil
		case decision.Busy:
			res = result{outcome: "busy", reason: "another delivery is between the steps of its side effect"}
			return nil
		}
		c.metrics.attempt.Record(ctx, int64(decision.Attempt), metric.WithAttributes(attrConsumer.String(c.def.name)))

		out, err := h(ctx, tx, d)
		if err != nil {
			return err
		}
		afterCommit = out.AfterCommit
		if len(out.Publish) > 0 {
			if _, err := c.outbox.Write(ctx, tx, d.Cause(), out.Publish...); err != nil {
				return err
			}
		}
		switch {
		case out.External != nil:
			external = out.External
			res = result{outcome: "processed"}
			return Hold(ctx, tx, c.def.name, d.MessageID) // PROCESSING until the second step
		case out.Ignored != "":
			res = result{outcome: "ignored", reason: out.Ignored}
			return MarkProcessed(ctx, tx, c.def.name, d.MessageID, OutcomeIgnored, out.Ignored)
		}
		res = result{outcome: "processed"}
		return nil // BeginInbox wrote the row PROCESSED (APPLIED): true as of the commit
	})
	if err == nil && afterCommit != nil {
		afterCommit(ctx)
	}
	return res, external, err
}

func (c *loop) inTx(ctx context.Context, f func(pgx.Tx) error) error {
	start := time.Now()
	err := pgx.BeginFunc(ctx, c.deps.Pool, f)
	c.metrics.txDuration.Record(ctx, time.Since(start).Seconds(), metric.WithAttributes(attrConsumer.String(c.def.name)))
	return err
}

// retryTx runs f again, at once, when it lost a serialization failure or a
// deadlock: the standard remedy, and no reason to send the message round
// the retry queues.
func retryTx(ctx context.Context, f func() error) error {
	var err error
	for try := 1; try <= 3; try++ {
		if err = f(); err == nil || !retryableInPlace(err) || ctx.Err() != nil {
			return err
		}
		background.Sleep(ctx, time.Duration(try)*10*time.Millisecond)
	}
	return err
}

func retryableInPlace(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "40001" || pgErr.Code == "40P01")
}
