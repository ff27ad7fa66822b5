package inbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/metric"

	"github.com/yourorg/orders/internal/background"
	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/messaging"
	"github.com/yourorg/orders/internal/messaging/outbox"
	"github.com/yourorg/orders/internal/telemetry"
)

// result is what became of one delivery.
type result struct {
	outcome string // processed, ignored, duplicate, busy
	reason  string
}

// step is one delivery on its way through the pipeline: its span and log
// context, the envelope as parsed, and its handler.
type step struct {
	raw   amqp.Delivery
	ctx   context.Context // carries the span and the log attributes
	span  trace.Span
	d     *Delivery
	h     handler
	err   error // the envelope is invalid, or no handler reads it: fail at once
	start time.Time
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
	s := c.begin(ctx, raw)
	defer s.span.End()
	var res result
	err := s.err
	if err == nil {
		res, err = c.applyHolding(s.ctx, s.d, s.h)
	}
	c.settle(s, pub, res, err)
}

// begin starts a delivery's span, parses its envelope and finds its
// handler.
func (c *loop) begin(ctx context.Context, raw amqp.Delivery) *step {
	s := &step{raw: raw, start: time.Now()}
	ctx, s.span = processSpan(ctx, c.tracer, raw, QueueName(c.def.name), c.def.name)
	s.d, s.err = parseDelivery(raw)
	if sc := s.span.SpanContext(); sc.IsValid() {
		s.d.TraceID = sc.TraceID().String() // every inbox row names its trace
	}
	attrs := metric.WithAttributes(attrConsumer.String(c.def.name), messaging.AttrMessageType.String(s.d.Type))
	c.metrics.received.Add(ctx, 1, attrs)
	if raw.Redelivered {
		c.metrics.redelivered.Add(ctx, 1, attrs)
	}
	s.ctx = telemetry.WithLogAttrs(ctx, slog.String("message_id", s.d.MessageID),
		slog.String("message_type", s.d.Type), slog.String("correlation_id", s.d.CorrelationID), slog.String("order_id", s.d.OrderID()),
		slog.Int("attempt", s.d.Attempt), slog.Bool("redelivered", raw.Redelivered))
	if s.err == nil {
		s.h, s.err = c.def.handlerOf(s.d)
	}
	return s
}

// settle ends a delivery by what became of it: acknowledged after its
// commit, sent round a retry queue, or parked.
func (c *loop) settle(s *step, pub *confirmPublisher, res result, err error) {
	ctx, d := s.ctx, s.d
	if err != nil {
		c.fail(ctx, pub, s.raw, d, err, s.start)
		return
	}
	if res.outcome == "busy" { // another delivery holds the message: look again later
		c.retryLater(ctx, pub, s.raw, d, d.Attempt, "busy", res.reason, s.start)
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
	if err := s.raw.Ack(false); err != nil {
		// The channel is gone; the broker delivers the message again, and
		// the inbox row makes that delivery a duplicate.
		c.log.WarnContext(ctx, "ack failed after commit; the redelivery will be a duplicate", slog.String("error", err.Error()))
		return
	}
	took := time.Since(s.start)
	c.metrics.duration.Record(ctx, took.Seconds(), metric.WithAttributes(attrConsumer.String(c.def.name), messaging.AttrOutcome.String(res.outcome)))
	s.span.SetAttributes(messaging.AttrOutcome.String(res.outcome))
	logAttrs := []any{slog.String("outcome", res.outcome), slog.Duration("took", took)}
	if res.reason != "" {
		logAttrs = append(logAttrs, slog.String("reason", res.reason))
	}
	switch res.outcome {
	case "duplicate":
		c.metrics.duplicates.Add(ctx, 1, metric.WithAttributes(attrConsumer.String(c.def.name), messaging.AttrMessageType.String(d.Type)))
		c.log.InfoContext(ctx, "duplicate acknowledged", logAttrs...)
	default:
		c.metrics.processed.Add(ctx, 1, metric.WithAttributes(attrConsumer.String(c.def.name), messaging.AttrMessageType.String(d.Type), messaging.AttrOutcome.String(res.outcome)))
		c.log.InfoContext(ctx, "message "+res.outcome, logAttrs...)
	}
}

// applyHolding applies d, holding the delivery while the database is
// unavailable (untilWritable).
func (c *loop) applyHolding(ctx context.Context, d *Delivery, h handler) (res result, err error) {
	err = c.untilWritable(ctx, func() error {
		var err error
		res, err = c.apply(ctx, d, h)
		return err
	})
	return res, err
}

// untilWritable runs f, and while it fails because the database is
// unavailable (down, unreachable, a read-only standby, out of disk:
// database.IsUnavailable) holds the delivery and runs f again, with growing
// waits, until a real write succeeds, f fails otherwise, or the process
// stops. The delivery stays unacknowledged and the worker takes no other,
// so the consumer pauses with its prefetched deliveries in hand instead of
// sending them round the broker: no message spends its retries or the
// queue's delivery limit, or reaches a parking lot, because the database
// was away. While any delivery is held the consumer is not ready.
func (c *loop) untilWritable(ctx context.Context, f func() error) error {
	held := false
	defer func() {
		if held {
			c.held.Add(-1)
		}
	}()
	for try := 1; ; try++ {
		err := f()
		if err == nil || !database.IsUnavailable(err) || ctx.Err() != nil {
			if held && err == nil {
				c.log.InfoContext(ctx, "database available again: the held delivery went on", slog.Int("tries", try))
			}
			return err
		}
		if !held {
			held = true
			c.held.Add(1)
			c.metrics.held.Add(ctx, 1, metric.WithAttributes(attrConsumer.String(c.def.name)))
			c.log.WarnContext(ctx, "database unavailable: holding the delivery until a write succeeds",
				slog.String("reason_code", database.TransientCode(err)), slog.String("error", err.Error()))
		}
		if !background.Sleep(ctx, background.Backoff(try, 200*time.Millisecond, 5*time.Second)) {
			return err // stopping: the delivery stays unacknowledged
		}
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
	var first effect
	err = retryTx(ctx, func() error {
		return c.inTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
			followUps := outbox.Buffer{Writer: c.outbox}
			var err error
			if first, err = c.firstStep(ctx, tx, d, h, rowNotTried, &followUps); err != nil {
				return err
			}
			return flushFollowUps(ctx, tx, &followUps)
		})
	})
	if err != nil {
		return first.res, err
	}
	return c.afterFirstStep(ctx, d, first)
}

// effect is what the first transaction of a delivery did: its outcome so
// far, the attempt it ran as, and what is left for after the commit.
type effect struct {
	res         result
	attempt     int
	external    *External             // a call to make, and its second step
	heldAt      time.Time             // when the row was held PROCESSING: the lease counts from there
	afterCommit func(context.Context) // the handler's, run once committed
}

// afterFirstStep runs what follows the commit of a delivery's first
// transaction: the handler's after-commit hook, then, for an external side
// effect, the call and the second step.
func (c *loop) afterFirstStep(ctx context.Context, d *Delivery, e effect) (result, error) {
	if e.afterCommit != nil {
		e.afterCommit(ctx)
	}
	if e.external == nil {
		return e.res, nil
	}
	return c.secondStep(ctx, d, e.external, e.attempt, e.heldAt)
}

// secondStep makes the call of an external side effect and records its
// result. The intent is committed, the row still PROCESSING and the
// processing lease running. The call may not outlive the lease: after it,
// another delivery may take the message over. The second step records the
// result, fenced by this attempt: after a takeover it records nothing, so a
// late original can neither run twice nor undo what the takeover recorded.
// While the database is away it waits, with the call's result in hand.
//
// The lease counts from heldAt, not from the commit: in a batch, the
// deliveries after this one ran in the same transaction first. So the call
// ends by 9/10 of the lease after heldAt, however long the commit took; a
// transaction that took longer than that leaves the call no time at all,
// and the row PROCESSING for a retry.
func (c *loop) secondStep(ctx context.Context, d *Delivery, external *External, attempt int, heldAt time.Time) (result, error) {
	callCtx, cancel := context.WithDeadline(ctx, heldAt.Add(c.cfg.ProcessingLease*9/10))
	callErr := external.Call(callCtx)
	cancel()
	err := c.untilWritable(ctx, func() error {
		return retryTx(ctx, func() error {
			return c.inTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
				fence := Fence // the row stays PROCESSING: the failed call is retried
				if callErr == nil {
					fence = fenceProcessed // fenced and PROCESSED in one statement
				}
				if err := fence(ctx, tx, c.def.name, d.MessageID, attempt); err != nil {
					return err
				}
				return external.Record(ctx, tx, callErr)
			})
		})
	})
	if errors.Is(err, ErrTakenOver) {
		return result{outcome: "duplicate", reason: "taken over by another delivery after the processing lease; this attempt recorded nothing"}, nil
	}
	if err != nil {
		return result{}, err
	}
	if callErr != nil {
		return result{}, callErr
	}
	return result{outcome: "processed"}, nil
}

// inboxRow is what became of a delivery's inbox row before its first
// step: in a batch, one insert (insertRows) tries the rows of all its
// deliveries first.
type inboxRow int

const (
	rowNotTried inboxRow = iota // one delivery: Begin inserts it
	rowInserted                 // inserted by the batch: a first delivery
	rowFound                    // there already: Begin's checks of a row seen before
)

// firstStep is the transaction of the effect, in tx: inbox row, handler,
// PROCESSED. The handler's follow-up messages go to followUps, which the
// caller flushes (flushFollowUps) in tx before the commit: a batch writes
// those of all its deliveries in one statement.
func (c *loop) firstStep(ctx context.Context, tx pgx.Tx, d *Delivery, h handler, row inboxRow, followUps *outbox.Buffer) (effect, error) {
	var e effect
	var decision Decision
	var err error
	switch entry := d.inboxEntry(c.def.name); row {
	case rowInserted:
		decision = Decision{Process: true, Attempt: 1} // as Begin decides on a row it inserted
	case rowFound:
		decision, err = beginSeen(ctx, tx, entry, c.cfg.ProcessingLease)
	default:
		decision, err = Begin(ctx, tx, entry, c.cfg.ProcessingLease)
	}
	if err != nil {
		return e, err
	}
	switch {
	case decision.Duplicate:
		e.res = result{outcome: "duplicate", reason: "already processed"}
		if decision.PayloadMismatch {
			e.res.reason = "already processed; this delivery's body differs (a producer reused the message_id)"
			c.metrics.payloadMismatch.Add(ctx, 1, metric.WithAttributes(attrConsumer.String(c.def.name)))
		}
		return e, nil
	case decision.Busy:
		e.res = result{outcome: "busy", reason: "another delivery is between the steps of its side effect"}
		return e, nil
	}
	e.attempt = decision.Attempt
	c.metrics.attempt.Record(ctx, int64(decision.Attempt), metric.WithAttributes(attrConsumer.String(c.def.name)))

	out, err := h(ctx, tx, d)
	if err != nil {
		return e, err
	}
	e.afterCommit = out.AfterCommit
	if _, err := followUps.Add(ctx, d.Cause(), out.Publish...); err != nil {
		return e, err
	}
	switch {
	case out.External != nil:
		e.external = out.External
		e.res = result{outcome: "processed"}
		// PROCESSING until the second step; the lease counts from here
		// (time.Now() is no later than the row's processing_started_at).
		e.heldAt = time.Now()
		return e, Hold(ctx, tx, c.def.name, d.MessageID)
	case out.Ignored != "":
		e.res = result{outcome: "ignored", reason: out.Ignored}
		return e, MarkProcessed(ctx, tx, c.def.name, d.MessageID, OutcomeIgnored, out.Ignored)
	}
	e.res = result{outcome: "processed"}
	return e, nil // Begin wrote the row PROCESSED (APPLIED): true as of the commit
}

// flushFollowUps writes the follow-up messages of a transaction's
// deliveries, in one statement: the last one before the commit.
func flushFollowUps(ctx context.Context, tx pgx.Tx, followUps *outbox.Buffer) error {
	if err := followUps.Flush(ctx, tx); err != nil {
		return fmt.Errorf("write follow-up messages: %w", err)
	}
	return nil
}

// inTx runs f in a transaction bounded by CONSUMER_TX_TIMEOUT, so that a
// connection that stopped answering cannot hang a worker.
func (c *loop) inTx(ctx context.Context, f func(context.Context, pgx.Tx) error) error {
	start := time.Now()
	txCtx, cancel := context.WithTimeout(ctx, c.cfg.TxTimeout)
	defer cancel()
	err := pgx.BeginFunc(txCtx, c.deps.Pool, func(tx pgx.Tx) error { return f(txCtx, tx) })
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
