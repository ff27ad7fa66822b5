package inbox

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/messaging"
	"github.com/yourorg/orders/internal/messaging/inbox/internal/resend"
)

// failure is a classified processing error.
type failure struct {
	code      string
	permanent bool
	err       error
}

func (f *failure) Error() string { return f.code + ": " + f.err.Error() }
func (f *failure) Unwrap() error { return f.err }

// Permanent marks err as a failure no retry can fix, under a short code:
// the message is parked at once.
func Permanent(code string, err error) error { return &failure{code: code, permanent: true, err: err} }

// Retryable marks err as a failure worth retrying later, under a code:
// the message goes round the retry queues, and is parked as poison once its
// attempts run out.
func Retryable(code string, err error) error { return &failure{code: code, err: err} }

// Classify names a processing error and says whether a retry can help.
// An error a handler wrapped with Permanent or Retryable says so itself;
// invalid messages (the consumer's own checks) are permanent, and so is a
// row the handler's query did not find (database.ErrNotFound); database
// trouble (lock_timeout, statement_timeout, serialization_failure,
// deadlock, database_unavailable), a unique violation (conflict) and
// errors nobody classified are transient: retried with growing delays,
// then parked as poison.
func Classify(err error) (code string, permanent bool) {
	var f *failure
	switch {
	case errors.As(err, &f):
		return f.code, f.permanent
	case errors.Is(err, database.ErrNotFound):
		return "not_found", true
	case dbTransient(err):
		return database.TransientCode(err), false
	case errors.Is(err, database.ErrUniqueViolation):
		return "conflict", false
	}
	return "handler_error", false
}

// dbTransient reports whether err is the database's (database.Run marked
// it: never an external call's network error or deadline), and transient.
func dbTransient(err error) bool { return database.IsFault(err) && database.IsTransient(err) }

// fail records a failed delivery on its inbox row and moves the message
// on: to a retry queue (transient, attempts left) or to the parking lot
// (permanent, or attempts exhausted), then acknowledges it. The inbox row
// and the broker always agree: if either step fails, the delivery is not
// acknowledged, and the broker delivers it again.
func (w *worker) fail(d *delivery, cause error) {
	ctx := d.ctx
	if ctx.Err() != nil {
		// Shutting down: the transaction was cut short. Leave the delivery
		// unacknowledged; the broker gives it to the next consumer.
		w.log.InfoContext(ctx, "delivery left for redelivery at shutdown")
		return
	}
	code, permanent := Classify(cause)
	span := trace.SpanFromContext(ctx)
	span.RecordError(cause)
	span.SetStatus(codes.Error, code)
	span.SetAttributes(attrCode.String(code))
	status := StatusRetryableFailed
	switch {
	case permanent:
		status = StatusPermanentFailed
	case d.Attempt >= w.cfg.MaxAttempts && !dbTransient(cause):
		// Only failures of the message's own handling spend its retry
		// budget. Database contention (a lock or statement timeout, a
		// deadlock that outlived its in-place retries) is the
		// infrastructure's: the message goes on round the retry queues, at
		// the longest delay, and is never parked as poison for it.
		status = StatusPoisoned
	}
	reason := cause.Error()

	if d.MessageID != "" {
		// Remember the failure in a transaction of its own (the attempt's
		// rolled back), before the message leaves this consumer.
		err := w.tx(ctx, 1, func(ctx context.Context, tx pgx.Tx) error {
			_, err := recordFailure(ctx, tx, d.inboxEntry(w.consumer.name), failedAttempt{
				Status: status, Code: code, Message: reason, HeldAttempt: d.heldAttempt, Lease: w.cfg.ProcessingLease,
			})
			return err
		})
		if errors.Is(err, errProcessed) || errors.Is(err, errTakenOver) {
			// PROCESSED meanwhile, or held by another delivery that took the
			// message over: that one settles it.
			why := "processed by another delivery"
			if errors.Is(err, errTakenOver) {
				why = "taken over by another delivery after the processing lease; this attempt's failure is not recorded"
			}
			_ = d.raw.Ack(false)
			w.metrics.duplicates.Add(ctx, 1, metric.WithAttributes(attrConsumer.String(w.consumer.name), messaging.AttrMessageType.String(d.Type)))
			w.log.InfoContext(ctx, "duplicate acknowledged", slog.String("outcome", "duplicate"), slog.String("reason", why))
			return
		}
		if err != nil {
			w.requeue(d, "cannot record the failure: "+err.Error())
			return
		}
	}

	if status == StatusRetryableFailed {
		w.metrics.retried.Add(ctx, 1, metric.WithAttributes(attrConsumer.String(w.consumer.name), attrCode.String(code)))
		w.ordering.retry(w, d, d.Attempt+1, code, reason)
		return
	}
	if status == StatusPoisoned {
		w.metrics.poisoned.Add(ctx, 1, metric.WithAttributes(attrConsumer.String(w.consumer.name)))
	} else {
		w.metrics.permanent.Add(ctx, 1, metric.WithAttributes(attrConsumer.String(w.consumer.name), attrCode.String(code)))
	}
	w.park(d, code, reason)
}

// retryLater republishes the message to the retry queue for attempt and
// acknowledges the original once the broker confirmed the copy.
func (w *worker) retryLater(d *delivery, attempt int, code, reason string) {
	ctx, start := d.ctx, d.start
	msg := resend.Copy(d.raw)
	msg.Headers[HeaderRetryAttempt] = int32(attempt)
	queue := w.topology.retryQueueAfter(attempt - 1)
	if err := w.pub.Publish(ctx, queue, msg); err != nil {
		w.requeue(d, "cannot schedule the retry: "+err.Error())
		return
	}
	if err := d.raw.Ack(false); err != nil {
		w.log.WarnContext(ctx, "ack failed after scheduling the retry; the redelivery will be retried too", slog.String("error", err.Error()))
		return
	}
	w.metrics.duration.Record(ctx, time.Since(start).Seconds(), metric.WithAttributes(attrConsumer.String(w.consumer.name), messaging.AttrOutcome.String("retried")))
	w.log.WarnContext(ctx, "retry scheduled", slog.String("outcome", "retried"), slog.String("reason_code", code),
		slog.String("reason", reason), slog.Int("next_attempt", attempt), slog.String("retry_queue", queue),
		slog.Duration("took", time.Since(start)))
}

// park publishes the message to the parking lot with headers that say why,
// and acknowledges the original once the broker confirmed the copy.
func (w *worker) park(d *delivery, code, reason string) {
	ctx, start := d.ctx, d.start
	queue := w.queue
	msg := resend.Copy(d.raw)
	msg.Headers[resend.HeaderParkedCode] = code
	msg.Headers[resend.HeaderParkedReason] = reason
	msg.Headers[resend.HeaderParkedConsumer] = w.consumer.name
	msg.Headers[resend.HeaderParkedAttempts] = int32(d.Attempt)
	msg.Headers[resend.HeaderParkedAt] = time.Now().UTC().Format(time.RFC3339Nano)
	msg.Headers[resend.HeaderParkedFromQueue] = queue
	msg.Headers[resend.HeaderOriginalKey] = d.raw.RoutingKey
	if id := d.AggregateID(); id != "" {
		msg.Headers[resend.HeaderParkedAggregateID] = id
	}
	if err := w.pub.Publish(ctx, ParkingLotName(w.topology.Queue()), msg); err != nil {
		w.requeue(d, "cannot park the message: "+err.Error())
		return
	}
	if err := d.raw.Ack(false); err != nil {
		w.log.WarnContext(ctx, "ack failed after parking; the redelivery will be parked again", slog.String("error", err.Error()))
		return
	}
	w.metrics.parked.Add(ctx, 1, metric.WithAttributes(attrConsumer.String(w.consumer.name), attrCode.String(code)))
	w.metrics.duration.Record(ctx, time.Since(start).Seconds(), metric.WithAttributes(attrConsumer.String(w.consumer.name), messaging.AttrOutcome.String("parked")))
	w.log.ErrorContext(ctx, "message parked", slog.String("outcome", "parked"), slog.String("reason_code", code),
		slog.String("reason", reason), slog.String("parking_lot", ParkingLotName(w.topology.Queue())), slog.Duration("took", time.Since(start)))
}

// requeue gives a delivery back when it could not be moved on (the retry
// or parking publish failed: broker trouble): to the broker after a
// moment, or to the worker in place (the worker's ordering). The work
// queue's delivery limit bounds the redeliveries, and what it parks says
// why (ParkedReason). Database trouble never comes here: those deliveries
// are held (worker.tx).
func (w *worker) requeue(d *delivery, why string) {
	ctx := d.ctx
	w.log.WarnContext(ctx, "delivery requeued", slog.String("outcome", "requeued"), slog.String("reason", why))
	w.metrics.requeued.Add(ctx, 1, metric.WithAttributes(attrConsumer.String(w.consumer.name)))
	w.ordering.requeue(w, d)
}
