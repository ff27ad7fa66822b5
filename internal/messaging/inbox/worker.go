package inbox

import (
	"context"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/logctx"
	"github.com/yourorg/orders/internal/messaging"
	"github.com/yourorg/orders/internal/messaging/inbox/internal/resend"
	"github.com/yourorg/orders/internal/messaging/outbox"
)

// worker takes the deliveries of one consumer through the inbox, a batch
// at a time (a single delivery is a batch of one). Each session of a
// subscription runs Workers of them on its deliveries.
type worker struct {
	consumer *Consumer // its handlers
	cfg      Config
	pool     *pgxpool.Pool
	pub      *resend.Publisher // the session's: retries and parkings
	topology Topology          // the consumer's queues
	log      *slog.Logger
	tracer   trace.Tracer
	metrics  *consumerMetrics
	held     *atomic.Int64 // the subscription's deliveries held for the database (readiness)
	// queue is the work queue this worker takes deliveries from.
	queue string
	// ordering keeps the order of the queue's deliveries, or does not
	// need to (ordering.go).
	ordering ordering
	// stop closes when the worker's session ends (shutdown, or its
	// channel lost): a delivery it still holds is the broker's again.
	stop <-chan struct{}
}

// delivery is one delivery on its way through a worker: the AMQP delivery,
// its envelope and payload as parsed, its handler, and the span and the
// log context of its processing.
type delivery struct {
	*Delivery
	raw   amqp.Delivery
	ctx   context.Context // carries the span and the log attributes
	span  trace.Span
	h     handler
	err   error // the envelope is invalid, or no handler reads it: fail at once
	start time.Time
	// heldAttempt is the attempt that committed the message's row
	// PROCESSING before an external call; 0 when none did.
	heldAttempt int
	// retryIn, when above 0, asks for the delivery to be tried again in
	// place after this wait (an ordered worker's retries: ordering.go).
	retryIn time.Duration
}

// result is what became of one delivery.
type result struct {
	outcome string // processed, ignored, duplicate, busy
	reason  string
}

// effect is what a delivery's transaction did: its outcome so far, the
// attempt it ran as, and what is left for after the commit.
type effect struct {
	res         result
	attempt     int
	external    *External             // a call to make, and its second step
	followUps   []messaging.Message   // with an external call: written by its second step
	heldAt      time.Time             // when the row was held PROCESSING: the lease counts from there
	afterCommit func(context.Context) // the handler's, run once committed
}

// handle takes deliveries through the inbox. This is the whole promise of
// the inbox, top to bottom:
//
//	open      each delivery: its span, its envelope, its handler, its payload
//	BEGIN
//	  insert  the inbox rows of every delivery, in one statement
//	  apply   per delivery: first time, duplicate or busy; its handler
//	  write   the follow-up messages of all of them, in one statement
//	COMMIT
//	finish    per delivery: its handler's after-commit hook; an external
//	          call and its second step (external.go)
//	settle    per delivery: ack, now that its row is committed; or retry
//	          later, or park, once the copy is safely on the broker
//
// A delivery is acknowledged only after the commit that holds its inbox
// row, or after it was parked. When any delivery of a batch of several
// fails, the transaction rolls back whole and each goes through again
// alone, so one bad message never takes others down with it.
//
// How a batch is split, and how a failure is retried, is the worker's
// ordering (ordering.go): pooled, or ordered within a partition.
func (w *worker) handle(ctx context.Context, raws []amqp.Delivery) {
	w.metrics.batchSize.Record(ctx, int64(len(raws)), metric.WithAttributes(attrConsumer.String(w.consumer.name)))
	batch := make([]*delivery, 0, len(raws))
	for _, raw := range raws {
		d := w.open(ctx, raw)
		defer d.span.End()
		if d.err != nil {
			w.settle(d, result{}, d.err) // an invalid envelope or payload: parked at once
			if !w.retryInPlace(ctx, d) {
				return // the session ended: the broker has the rest again
			}
			continue
		}
		batch = append(batch, d)
	}
	w.ordering.run(ctx, w, batch)
}

// process applies a batch in one transaction and settles each delivery.
func (w *worker) process(ctx context.Context, batch []*delivery) {
	if len(batch) == 0 {
		return
	}
	effects, err := w.apply(ctx, batch)
	if err != nil && len(batch) > 1 {
		w.log.DebugContext(ctx, "batch rolled back; applying its deliveries one by one",
			slog.Int("deliveries", len(batch)), slog.String("error", err.Error()))
		for _, d := range batch {
			w.process(ctx, []*delivery{d})
		}
		return
	}
	for i, d := range batch {
		if err != nil {
			w.settle(d, result{}, err)
			continue
		}
		res, err := w.finish(d, effects[i])
		w.settle(d, res, err)
	}
}

// retryInPlace tries a delivery again, alone, for as long as its failure
// asks for it (an ordered worker's retries: d.retryIn), waiting in between.
// The delivery stays unacknowledged meanwhile, and the worker takes no
// other: its partition waits behind it. An invalid delivery (d.err) whose
// parking failed is parked again. A retry never outlives the session that
// received the delivery (shutdown, or its channel lost): the delivery is
// left unacknowledged, and the broker gives it again, before the later
// ones of its queue, to the next session of this process or another. It
// returns false then, and the worker takes nothing more.
func (w *worker) retryInPlace(ctx context.Context, d *delivery) bool {
	for d.retryIn > 0 {
		t := time.NewTimer(d.retryIn)
		select {
		case <-t.C:
		case <-w.stop:
			t.Stop()
			w.log.WarnContext(d.ctx, "retry in place given up: the session ended; the broker delivers the message again",
				slog.Int("attempt", d.Attempt))
			return false
		case <-ctx.Done():
			t.Stop()
			return false
		}
		d.retryIn, d.heldAttempt = 0, 0
		d.Attempt++
		if d.err != nil {
			w.settle(d, result{}, d.err)
			continue
		}
		w.process(ctx, []*delivery{d})
	}
	return true
}

// open starts a delivery's span, parses its envelope, finds its handler,
// checks its body against its schema (Config.ValidateBody) and decodes its
// payload.
func (w *worker) open(ctx context.Context, raw amqp.Delivery) *delivery {
	d := &delivery{raw: raw, start: time.Now()}
	ctx, d.span = processSpan(ctx, w.tracer, raw, w.topology.Queue(), w.consumer.name)
	d.Delivery, d.err = parseDelivery(raw)
	if sc := d.span.SpanContext(); sc.IsValid() {
		d.TraceID = sc.TraceID().String() // every inbox row names its trace
	}
	if d.err == nil {
		d.h, d.err = w.consumer.handlerOf(d.Delivery)
	}
	if d.err == nil && w.cfg.ValidateBody != nil {
		if err := w.cfg.ValidateBody(d.Type, d.Version, raw.Body); err != nil {
			d.err = Permanent("schema_violation", err)
		}
	}
	if d.err == nil {
		d.Message, d.err = d.h.decode(raw.Body)
	}
	attrs := metric.WithAttributes(attrConsumer.String(w.consumer.name), messaging.AttrMessageType.String(d.Type))
	w.metrics.received.Add(ctx, 1, attrs)
	if raw.Redelivered {
		w.metrics.redelivered.Add(ctx, 1, attrs)
	}
	d.ctx = logctx.With(ctx, slog.String("message_id", d.MessageID), slog.String("message_type", d.Type),
		slog.String("correlation_id", d.CorrelationID), slog.String("aggregate_id", d.AggregateID()),
		slog.Int("attempt", d.Attempt), slog.Bool("redelivered", raw.Redelivered))
	return d
}

// apply is the transaction of a batch:
//
//	BEGIN
//	insert the inbox rows of every delivery, in one statement (insertRows)
//	per delivery, in order: decide on its row, run its handler (step)
//	write the follow-up messages of all of them, in one statement
//	COMMIT
//
// A transaction that loses a serialization failure or a deadlock runs
// again at once; while the database is unavailable, the batch is held and
// tried again (tx). A handler that panics is a bug no retry fixes: the
// transaction rolls back, and the delivery is parked, while the process
// and its other deliveries go on.
func (w *worker) apply(ctx context.Context, batch []*delivery) (effects []effect, err error) {
	defer func() {
		if r := recover(); r != nil {
			w.log.ErrorContext(ctx, "handler panicked", slog.Any("panic", r), slog.String("stack", string(debug.Stack())))
			err = Permanent("handler_panic", fmt.Errorf("the handler panicked: %v", r))
		}
	}()
	entries := make([]entry, len(batch))
	for i, d := range batch {
		entries[i] = d.inboxEntry(w.consumer.name)
	}
	err = w.tx(ctx, len(batch), func(txCtx context.Context, tx pgx.Tx) error {
		effects = make([]effect, len(batch)) // afresh on each run
		inserted, err := insertRows(txCtx, tx, w.consumer.name, entries, w.ordering.holdsBehindParked())
		if err != nil {
			return err
		}
		followUps := outbox.Buffer{Writer: w.cfg.FollowUps}
		deadline, _ := txCtx.Deadline()
		for i, d := range batch {
			// Each delivery's statements in its own trace, under the
			// transaction's deadline.
			dctx, cancel := context.WithDeadline(d.ctx, deadline)
			effects[i], err = w.step(dctx, tx, d, inserted[i], &followUps)
			cancel()
			if err != nil {
				if len(batch) > 1 {
					err = fmt.Errorf("message %s: %w", d.MessageID, err)
				}
				return err
			}
		}
		if err := followUps.Flush(txCtx, tx); err != nil {
			return fmt.Errorf("write follow-up messages: %w", err)
		}
		return nil
	})
	return effects, err
}

// step is one delivery's part of its transaction: decide on its inbox row
// (ins.Inserted: a first delivery; found: a duplicate, busy elsewhere, or
// another attempt), run its handler, and record how it ended. Its
// follow-up messages go to followUps, which apply writes before the commit.
func (w *worker) step(ctx context.Context, tx pgx.Tx, d *delivery, ins insertion, followUps *outbox.Buffer) (effect, error) {
	var e effect
	dec := decision{Process: true, Attempt: 1} // a row it inserted: a first delivery
	if !ins.Inserted {
		var err error
		if dec, err = beginSeen(ctx, tx, d.inboxEntry(w.consumer.name), w.cfg.ProcessingLease); err != nil {
			return e, err
		}
	}
	switch {
	case dec.Duplicate:
		e.res = result{outcome: "duplicate", reason: "already processed"}
		if dec.PayloadMismatch {
			e.res.reason = "already processed; this delivery's body differs (a producer reused the message_id)"
			w.metrics.payloadMismatch.Add(ctx, 1, metric.WithAttributes(attrConsumer.String(w.consumer.name)))
		}
		return e, nil
	case dec.Busy:
		e.res = result{outcome: "busy", reason: "another delivery is between the steps of its side effect"}
		return e, nil
	}
	e.attempt = dec.Attempt
	w.metrics.attempt.Record(ctx, int64(dec.Attempt), metric.WithAttributes(attrConsumer.String(w.consumer.name)))
	if err := w.ordering.admit(ctx, tx, w, d, ins); err != nil {
		return e, err
	}

	out, err := d.h.run(ctx, tx, d.Delivery)
	if err != nil {
		return e, err
	}
	e.afterCommit = out.AfterCommit
	if out.External != nil {
		// The follow-ups of a call are written with its second step, once
		// the call succeeded: a failed call is retried, and each retry's
		// handler returns them again, under new ids.
		e.followUps = out.Publish
	} else if _, err := followUps.Add(ctx, d.Cause(), out.Publish...); err != nil {
		return e, err
	}
	switch {
	case out.External != nil:
		e.external = out.External
		e.res = result{outcome: "processed"}
		// PROCESSING until the second step; the lease counts from here
		// (time.Now() is no later than the row's processing_started_at).
		e.heldAt = time.Now()
		return e, hold(ctx, tx, w.consumer.name, d.MessageID)
	case out.Ignored != "":
		e.res = result{outcome: "ignored", reason: out.Ignored}
		return e, markProcessed(ctx, tx, w.consumer.name, d.MessageID, OutcomeIgnored, out.Ignored)
	}
	e.res = result{outcome: "processed"}
	return e, nil // the row was written PROCESSED (APPLIED): true as of the commit
}

// finish runs what follows a delivery's commit: the handler's after-commit
// hook, then, for an external side effect, the call and its second step.
func (w *worker) finish(d *delivery, e effect) (result, error) {
	if e.afterCommit != nil {
		e.afterCommit(d.ctx)
	}
	if e.external == nil {
		return e.res, nil
	}
	return w.secondStep(d, e)
}

// settle ends a delivery by what became of it: acknowledged after its
// commit, sent round a retry queue, or parked (failure.go).
func (w *worker) settle(d *delivery, res result, err error) {
	ctx := d.ctx
	if err != nil {
		w.fail(d, err)
		return
	}
	if res.outcome == "busy" { // another delivery holds the message: look again later
		w.ordering.retry(w, d, d.Attempt, "busy", res.reason) // finding it busy spends no attempt
		return
	}
	if w.cfg.Faults != nil {
		w.cfg.Faults.AfterCommit(ctx, d.Delivery)
	}
	if err := d.raw.Ack(false); err != nil {
		// The channel is gone; the broker delivers the message again, and
		// the inbox row makes that delivery a duplicate.
		w.log.WarnContext(ctx, "ack failed after commit; the redelivery will be a duplicate", slog.String("error", err.Error()))
		return
	}
	took := time.Since(d.start)
	consumer := attrConsumer.String(w.consumer.name)
	w.metrics.duration.Record(ctx, took.Seconds(), metric.WithAttributes(consumer, messaging.AttrOutcome.String(res.outcome)))
	d.span.SetAttributes(messaging.AttrOutcome.String(res.outcome))
	logAttrs := []any{slog.String("outcome", res.outcome), slog.Duration("took", took)}
	if res.reason != "" {
		logAttrs = append(logAttrs, slog.String("reason", res.reason))
	}
	switch res.outcome {
	case "duplicate":
		w.metrics.duplicates.Add(ctx, 1, metric.WithAttributes(consumer, messaging.AttrMessageType.String(d.Type)))
		w.log.InfoContext(ctx, "duplicate acknowledged", logAttrs...)
	default:
		w.metrics.processed.Add(ctx, 1, metric.WithAttributes(consumer, messaging.AttrMessageType.String(d.Type), messaging.AttrOutcome.String(res.outcome)))
		w.log.InfoContext(ctx, "message "+res.outcome, logAttrs...)
	}
}

// tx runs f as a transaction of the inbox (database.Run): each run bounded
// by CONSUMER_TX_TIMEOUT, so that a connection that stopped answering
// cannot hang a worker; run again at once when it lost a serialization
// failure or a deadlock, the standard remedy and no reason to send the
// message round the retry queues; and held while the database is
// unavailable (down, unreachable, a read-only standby, out of disk: an
// error of the database's, never an external call's), run again with
// growing waits until a real write succeeds, f fails otherwise, or the
// process stops. The deliveries stay unacknowledged meanwhile and the
// worker takes no others, so the consumer pauses with its prefetched
// deliveries in hand instead of sending them round the broker: no message
// spends its retries or the queue's delivery limit, or reaches a parking
// lot, because the database was away. While any delivery is held the
// consumer is not ready. A COMMIT cut off in flight is run again too: the
// inbox row makes the second run a duplicate.
func (w *worker) tx(ctx context.Context, deliveries int, f func(context.Context, pgx.Tx) error) error {
	hold := &database.Hold{Start: func(ctx context.Context, cause error) func(error) {
		w.held.Add(int64(deliveries))
		w.metrics.held.Add(ctx, int64(deliveries), metric.WithAttributes(attrConsumer.String(w.consumer.name)))
		w.log.WarnContext(ctx, "database unavailable: holding the deliveries until a write succeeds", slog.Int("deliveries", deliveries),
			slog.String("reason_code", database.TransientCode(cause)), slog.String("error", cause.Error()))
		return func(err error) {
			w.held.Add(-int64(deliveries))
			if err == nil {
				w.log.InfoContext(ctx, "database available again: the held deliveries went on")
			}
		}
	}}
	var start time.Time // of the last run: what the duration metric records
	err := database.Run(ctx, w.pool, database.Policy{Timeout: w.cfg.TxTimeout, RetryContention: 2, Hold: hold},
		func(ctx context.Context, tx pgx.Tx) error {
			start = time.Now()
			return f(ctx, tx)
		})
	if !start.IsZero() {
		w.metrics.txDuration.Record(ctx, time.Since(start).Seconds(), metric.WithAttributes(attrConsumer.String(w.consumer.name)))
	}
	return err
}
