package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/yourorg/orders/internal/messaging"

	"go.opentelemetry.io/otel/codes"
)

// outcome is what became of one claimed row.
type outcome struct {
	row    Row
	result string // a publish-attempt outcome, below
	reason string // for failures: what goes into last_error
}

// Publish attempt outcomes (the "outcome" label of outbox.publish.attempts).
const (
	outcomeConfirmed      = "confirmed"
	outcomeNacked         = "nacked"
	outcomeUnroutable     = "unroutable"
	outcomeTimeout        = "timeout"
	outcomeConnectionLost = "connection_lost"
	outcomeNotPublished   = "not_published"
	outcomeShutdown       = "shutdown"
)

// confirmLoop is steps 3 and 4: for each published batch, in order, it
// waits for the broker's confirms (awaitConfirms) and marks the rows by
// them (Relay.mark). When ctx ends first (the shutdown deadline),
// unconfirmed rows are handed back untried. A confirm that never comes
// means the channel cannot be trusted: the session ends, and the loop goes
// on marking what is still in flight.
func (s *session) confirmLoop(ctx context.Context, published <-chan *batch) error {
	r := s.relay
	var fatal error
	for b := range published {
		outcomes := s.awaitConfirms(ctx, b)
		endSpans(b, outcomes)
		err := r.mark(outcomes)
		s.window.Release(int64(len(b.rows)))
		r.inFlight.Add(-int64(len(b.rows)))
		if err != nil {
			return err
		}
		for _, o := range outcomes {
			if o.result == outcomeTimeout && fatal == nil {
				fatal = errors.New("publisher confirm timed out")
				s.stop(fatal)
			}
		}
	}
	return fatal
}

// awaitConfirms waits for the confirms of batch b until its confirm
// deadline or the shutdown deadline (ctx), and says what became of each row.
func (s *session) awaitConfirms(ctx context.Context, b *batch) []outcome {
	deadline := time.NewTimer(time.Until(b.publishedAt.Add(s.relay.cfg.ConfirmTimeout)))
	defer deadline.Stop()
	timedOut, stopping := false, false
	for _, dc := range b.confirms {
		if timedOut || stopping {
			break
		}
		select {
		case <-dc.Done():
		case <-deadline.C:
			timedOut = true
		case <-ctx.Done():
			stopping = true
		}
	}
	// Every return sent before these confirms is in the book now.
	s.returns.sync()

	outcomes := make([]outcome, len(b.rows))
	for i, row := range b.rows {
		o := &outcomes[i]
		o.row = row
		if i >= len(b.confirms) {
			o.result, o.reason = outcomeNotPublished, "not published: the channel closed first"
			continue
		}
		dc := b.confirms[i]
		ret, wasReturned := s.returns.take(row.ID.String())
		switch {
		case !isDone(dc) && stopping:
			o.result, o.reason = outcomeShutdown, "no confirm before shutdown"
		case !isDone(dc):
			o.result = outcomeTimeout
			o.reason = fmt.Sprintf("no publisher confirm within %s (RELAY_CONFIRM_TIMEOUT; the broker may have the message: a duplicate is possible)", s.relay.cfg.ConfirmTimeout)
		case wasReturned:
			o.result = outcomeUnroutable
			o.reason = fmt.Sprintf("unroutable: %d %s (no queue bound to exchange %s for routing key %s)",
				ret.ReplyCode, ret.ReplyText, row.Exchange, row.RoutingKey)
		case dc.Acked():
			o.result = outcomeConfirmed
			s.relay.metrics.confirmLatency.Record(context.Background(), time.Since(b.publishedAt).Seconds())
		case s.ch.IsClosed():
			o.result, o.reason = outcomeConnectionLost, "connection to RabbitMQ lost before the confirm"
		default:
			o.result, o.reason = outcomeNacked, "nacked by RabbitMQ"
		}
	}
	return outcomes
}

// endSpans ends the publish spans of a batch with what the broker said.
func endSpans(b *batch, outcomes []outcome) {
	failed := 0
	for i, span := range b.spans {
		span.SetAttributes(messaging.AttrOutcome.String(outcomes[i].result))
		if outcomes[i].result != outcomeConfirmed {
			failed++
			span.SetStatus(codes.Error, outcomes[i].reason)
		}
		span.End()
	}
	if failed > 0 {
		b.batchSpan.SetStatus(codes.Error, fmt.Sprintf("%d of %d messages not confirmed", failed, len(outcomes)))
	}
	b.batchSpan.End()
}

func isDone(dc *amqp.DeferredConfirmation) bool {
	select {
	case <-dc.Done():
		return true
	default:
		return false
	}
}
