package inbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/yourorg/orders/internal/background"
	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/domain"
	"github.com/yourorg/orders/internal/messaging"
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
// Invalid messages and impossible transitions are permanent; database
// trouble (lock_timeout, statement_timeout, serialization_failure,
// deadlock, database_unavailable) and errors nobody classified are
// transient: retried with growing delays, then parked as poison.
func Classify(err error) (code string, permanent bool) {
	var f *failure
	switch {
	case errors.As(err, &f):
		return f.code, f.permanent
	case errors.Is(err, domain.ErrUnknownMessageType):
		return "unknown_type", true
	case errors.Is(err, domain.ErrUnsupportedVersion):
		return "unsupported_version", true
	case errors.Is(err, domain.ErrMalformedMessage):
		return "malformed_message", true
	case errors.Is(err, domain.ErrInvalidTransition):
		return "invalid_transition", true
	case errors.Is(err, domain.ErrNotFound):
		return "not_found", true
	case database.IsTransient(err):
		return database.TransientCode(err), false
	case errors.Is(err, domain.ErrConflict):
		return "conflict", false
	}
	return "handler_error", false
}

// fail records a failed delivery on its inbox row and moves the message
// on: to a retry queue (transient, attempts left) or to the parking lot
// (permanent, or attempts exhausted), then acknowledges it. The inbox row
// and the broker always agree: if either step fails, the delivery is not
// acknowledged, and the broker delivers it again.
func (c *loop) fail(ctx context.Context, pub *confirmPublisher, raw amqp.Delivery, d *Delivery, cause error, start time.Time) {
	if ctx.Err() != nil {
		// Shutting down: the transaction was cut short. Leave the delivery
		// unacknowledged; the broker gives it to the next consumer.
		c.log.InfoContext(ctx, "delivery left for redelivery at shutdown")
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
	case d.Attempt >= c.cfg.MaxAttempts && !database.IsTransient(cause):
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
		err := c.untilWritable(ctx, func() error {
			recordCtx, cancel := context.WithTimeout(ctx, c.cfg.TxTimeout)
			defer cancel()
			_, err := RecordFailure(recordCtx, c.deps.Pool, d.inboxEntry(c.def.name), Failure{Status: status, Code: code, Message: reason})
			return err
		})
		if errors.Is(err, domain.ErrConflict) {
			// PROCESSED meanwhile (a concurrent delivery finished it).
			_ = raw.Ack(false)
			c.metrics.duplicates.Add(ctx, 1, metric.WithAttributes(attrConsumer.String(c.def.name), messaging.AttrMessageType.String(d.Type)))
			c.log.InfoContext(ctx, "duplicate acknowledged", slog.String("outcome", "duplicate"), slog.String("reason", "processed by another delivery"))
			return
		}
		if err != nil {
			c.requeue(ctx, raw, "cannot record the failure: "+err.Error())
			return
		}
	}

	if status == StatusRetryableFailed {
		c.metrics.retried.Add(ctx, 1, metric.WithAttributes(attrConsumer.String(c.def.name), attrCode.String(code)))
		c.retryLater(ctx, pub, raw, d, d.Attempt+1, code, reason, start)
		return
	}
	if status == StatusPoisoned {
		c.metrics.poisoned.Add(ctx, 1, metric.WithAttributes(attrConsumer.String(c.def.name)))
	} else {
		c.metrics.permanent.Add(ctx, 1, metric.WithAttributes(attrConsumer.String(c.def.name), attrCode.String(code)))
	}
	c.park(ctx, pub, raw, d, code, reason, start)
}

// retryLater republishes the message to the retry queue for attempt and
// acknowledges the original once the broker confirmed the copy.
func (c *loop) retryLater(ctx context.Context, pub *confirmPublisher, raw amqp.Delivery, d *Delivery, attempt int, code, reason string, start time.Time) {
	msg := republish(raw)
	msg.Headers[HeaderRetryAttempt] = int32(attempt)
	queue := c.topology.retryQueue(attempt - 1)
	if err := pub.publish(ctx, queue, msg); err != nil {
		c.requeue(ctx, raw, "cannot schedule the retry: "+err.Error())
		return
	}
	if err := raw.Ack(false); err != nil {
		c.log.WarnContext(ctx, "ack failed after scheduling the retry; the redelivery will be retried too", slog.String("error", err.Error()))
		return
	}
	c.metrics.duration.Record(ctx, time.Since(start).Seconds(), metric.WithAttributes(attrConsumer.String(c.def.name), messaging.AttrOutcome.String("retried")))
	c.log.WarnContext(ctx, "retry scheduled", slog.String("outcome", "retried"), slog.String("reason_code", code),
		slog.String("reason", reason), slog.Int("next_attempt", attempt), slog.String("retry_queue", queue),
		slog.Duration("took", time.Since(start)))
}

// park publishes the message to the parking lot with headers that say why,
// and acknowledges the original once the broker confirmed the copy.
func (c *loop) park(ctx context.Context, pub *confirmPublisher, raw amqp.Delivery, d *Delivery, code, reason string, start time.Time) {
	queue := QueueName(c.def.name)
	msg := republish(raw)
	msg.Headers[HeaderParkedCode] = code
	msg.Headers[HeaderParkedReason] = reason
	msg.Headers[HeaderParkedConsumer] = c.def.name
	msg.Headers[HeaderParkedAttempts] = int32(d.Attempt)
	msg.Headers[HeaderParkedAt] = time.Now().UTC().Format(time.RFC3339Nano)
	msg.Headers[HeaderParkedFromQueue] = queue
	msg.Headers[HeaderOriginalKey] = raw.RoutingKey
	if err := pub.publish(ctx, ParkingLotName(queue), msg); err != nil {
		c.requeue(ctx, raw, "cannot park the message: "+err.Error())
		return
	}
	if err := raw.Ack(false); err != nil {
		c.log.WarnContext(ctx, "ack failed after parking; the redelivery will be parked again", slog.String("error", err.Error()))
		return
	}
	c.metrics.parked.Add(ctx, 1, metric.WithAttributes(attrConsumer.String(c.def.name), attrCode.String(code)))
	c.metrics.duration.Record(ctx, time.Since(start).Seconds(), metric.WithAttributes(attrConsumer.String(c.def.name), messaging.AttrOutcome.String("parked")))
	c.log.ErrorContext(ctx, "message parked", slog.String("outcome", "parked"), slog.String("reason_code", code),
		slog.String("reason", reason), slog.String("parking_lot", ParkingLotName(queue)), slog.Duration("took", time.Since(start)))
}

// requeue gives a delivery back to the broker when it could not be moved
// on (the retry or parking publish failed: broker trouble). It waits a
// moment first, so that a broker that keeps refusing costs one redelivery
// per second, not a hot loop; the work queue's delivery limit bounds the
// rest, and what it parks says why (ParkedReason). Database trouble never
// comes here: those deliveries are held (untilWritable).
func (c *loop) requeue(ctx context.Context, raw amqp.Delivery, why string) {
	c.log.WarnContext(ctx, "delivery requeued", slog.String("outcome", "requeued"), slog.String("reason", why))
	c.metrics.requeued.Add(ctx, 1, metric.WithAttributes(attrConsumer.String(c.def.name)))
	background.Sleep(ctx, time.Second)
	_ = raw.Nack(false, true)
}

// ParkedReason says why a message is in a parking lot: the parked_reason_code
// and parked_reason headers the consumer wrote when it parked it; or, for a
// message the broker dead-lettered on its own (the work queue's
// x-delivery-limit: a consumer crashed on it again and again, or could never
// settle it), "delivery_limit" and what that means. Such a message has no
// inbox row that says why; replaying it is safe like any other.
func ParkedReason(h amqp.Table) (code, reason string) {
	if code := messaging.HeaderString(h, HeaderParkedCode); code != "" {
		return code, messaging.HeaderString(h, HeaderParkedReason)
	}
	if deaths, ok := h["x-death"].([]any); ok {
		for _, d := range deaths {
			death, ok := d.(amqp.Table)
			if !ok {
				continue
			}
			if why := messaging.HeaderString(death, "reason"); why == "delivery_limit" {
				return "delivery_limit", fmt.Sprintf("redelivered more than the delivery limit of %s (CONSUMER_DELIVERY_LIMIT): "+
					"a consumer crashed on it, or could not settle it, each time", messaging.HeaderString(death, "queue"))
			} else if why != "" {
				return "dead_lettered", fmt.Sprintf("dead-lettered by the broker from %s (%s)", messaging.HeaderString(death, "queue"), why)
			}
		}
	}
	return "unknown", "no parking headers: not parked by this service"
}
