package pipeline

import (
	"context"
	"fmt"
	"log/slog"

	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/sync/semaphore"

	"github.com/yourorg/orders/internal/background"
	"github.com/yourorg/orders/internal/messaging"
)

// Publisher is the broker side of a relay's session, whatever the rows'
// source: one channel in confirm mode, the book of its returns, the window
// of messages published and not yet confirmed, and whether the broker
// blocks publishers. It publishes rows (Publish), waits for their confirms
// and says what became of each (Await); Pipeline.Record writes that down.
// Pipeline.Connect makes one.
type Publisher struct {
	pipe    *Pipeline
	ch      *amqp.Channel
	returns *returnBook         // the broker's basic.returns, kept until their confirm is read
	window  *semaphore.Weighted // room for MaxInFlight unconfirmed messages
	blocked atomic.Bool         // the broker blocks publishers (a memory or disk alarm)
	stop    context.CancelCauseFunc
}

// Sent is a row handed to the broker (Publisher.Publish), or not.
type Sent struct {
	Row         Row
	confirm     *amqp.DeferredConfirmation // nil: not published
	span        trace.Span
	publishedAt time.Time
}

// Published reports whether the row went out (its confirm is awaited).
func (s Sent) Published() bool { return s.confirm != nil }

// Connect opens a broker connection and its confirm channel, named name in
// RabbitMQ's connection list, and returns its Publisher. The context it
// returns ends when the channel closes or Stop is called; the caller
// closes conn and calls Stop when its session ends.
func (pl *Pipeline) Connect(ctx context.Context, name string) (*amqp.Connection, *Publisher, context.Context, error) {
	conn, ch, err := messaging.Open(ctx, pl.deps.AMQPURL, name)
	if err != nil {
		return nil, nil, nil, err
	}
	if err := ch.Confirm(false); err != nil {
		_ = conn.CloseDeadline(time.Now().Add(time.Second))
		return nil, nil, nil, fmt.Errorf("confirm mode: %w", err)
	}
	p := &Publisher{pipe: pl, ch: ch, returns: newReturnBook(ch), window: semaphore.NewWeighted(int64(pl.cfg.MaxInFlight))}
	sessCtx, stop := context.WithCancelCause(ctx)
	p.stop = stop
	go p.watchChannel(ch.NotifyClose(make(chan *amqp.Error, 1)))
	go p.watchBlocked(ctx, conn.NotifyBlocked(make(chan amqp.Blocking, 4)))
	return conn, p, sessCtx, nil
}

// Stop ends the session, with cause (nil: a normal end).
func (p *Publisher) Stop(cause error) { p.stop(cause) }

// Release frees room for n messages in the window (WaitToPublish took it).
func (p *Publisher) Release(n int64) { p.window.Release(n) }

// Forget gives up on a sent row without awaiting its confirm (it will be
// published again): it frees its room in the window and ends its span.
func (p *Publisher) Forget(s Sent) {
	if s.confirm != nil {
		p.window.Release(1)
		p.pipe.inFlight.Add(-1)
	}
	if s.span != nil {
		s.span.SetStatus(codes.Error, "not confirmed: published again")
		s.span.End()
	}
}

// watchChannel ends the session when the broker closes the channel.
func (p *Publisher) watchChannel(closed <-chan *amqp.Error) {
	if amqpErr, ok := <-closed; ok {
		p.stop(fmt.Errorf("channel closed: %w", amqpErr))
	}
}

// watchBlocked pauses publishing while the broker blocks publishers (a
// memory or disk alarm).
func (p *Publisher) watchBlocked(ctx context.Context, blocked <-chan amqp.Blocking) {
	log := p.pipe.deps.Logger
	for b := range blocked {
		p.blocked.Store(b.Active)
		if b.Active {
			log.WarnContext(ctx, "RabbitMQ blocked publishing (resource alarm); publishing paused", slog.String("reason", b.Reason))
		} else {
			log.InfoContext(ctx, "RabbitMQ unblocked publishing; publishing again")
			p.pipe.deps.Wake()
		}
	}
}

// WaitToPublish waits for the broker to accept publishes and for room for
// n more messages in the window; false when ctx ends first. While the
// broker blocks publishers, nothing is taken: the rows would only wait for
// confirms that cannot come.
func (p *Publisher) WaitToPublish(ctx context.Context, n int64) bool {
	for p.blocked.Load() {
		if !background.Sleep(ctx, min(p.pipe.cfg.PollInterval, 200*time.Millisecond)) {
			return false
		}
	}
	return p.window.Acquire(ctx, n) == nil
}

// Publish publishes row, mandatory, with its confirm deferred, in a span
// that is a child of parent (the context that wrote the row). On failure
// the channel cannot be trusted: the caller ends the session.
func (p *Publisher) Publish(ctx, parent context.Context, row Row) (Sent, error) {
	msg := Publishing(row)
	s := Sent{Row: row, span: publishSpan(p.pipe.deps.Tracer, parent, &msg, row.Exchange, row.RoutingKey), publishedAt: time.Now()}
	dc, err := p.ch.PublishWithDeferredConfirmWithContext(ctx, row.Exchange, row.RoutingKey, true, false, msg)
	if err != nil {
		s.span.End()
		return Sent{Row: row}, fmt.Errorf("publish: %w", err)
	}
	s.confirm = dc
	p.pipe.inFlight.Add(1)
	return s, nil
}

// Await waits for the confirms of batch, each until ConfirmTimeout after
// its publish or until ctx ends (the shutdown deadline), says what became
// of each row, and ends the publish spans with it.
func (p *Publisher) Await(ctx context.Context, batch []Sent) []Outcome {
	timedOut, stopping := false, false
	for _, s := range batch {
		if s.confirm == nil || timedOut || stopping {
			continue
		}
		deadline := time.NewTimer(time.Until(s.publishedAt.Add(p.pipe.cfg.ConfirmTimeout)))
		select {
		case <-s.confirm.Done():
		case <-deadline.C:
			timedOut = true
		case <-ctx.Done():
			stopping = true
		}
		deadline.Stop()
	}
	// Every return sent before these confirms is in the book now.
	p.returns.sync()
	outcomes := make([]Outcome, len(batch))
	for i, s := range batch {
		outcomes[i] = p.classify(s, stopping)
		if s.confirm != nil {
			p.pipe.inFlight.Add(-1)
		}
		if s.span != nil {
			s.span.SetAttributes(messaging.AttrOutcome.String(outcomes[i].Result))
			if outcomes[i].Result != ResultConfirmed {
				s.span.SetStatus(codes.Error, outcomes[i].Reason)
			}
			s.span.End()
		}
	}
	return outcomes
}

// reasonNacked is a nacked row's last_error (bringBackNacked finds them by it).
const reasonNacked = "nacked by RabbitMQ"

// classify says what became of a sent row, once its confirm is done or
// awaited in vain: the broker confirmed, returned or nacked it, or the
// publish was cut short.
func (p *Publisher) classify(s Sent, stopping bool) Outcome {
	row := s.Row
	o := Outcome{Row: row}
	if s.confirm == nil {
		o.Result, o.Reason = ResultNotPublished, "not published: the session ended first"
		return o
	}
	ret, wasReturned := p.returns.take(row.ID.String())
	switch {
	case !isDone(s.confirm) && stopping:
		o.Result, o.Reason = ResultShutdown, "no confirm before shutdown"
	case !isDone(s.confirm):
		o.Result = ResultTimeout
		o.Reason = fmt.Sprintf("no publisher confirm within %s (RELAY_CONFIRM_TIMEOUT; the broker may have the message: a duplicate is possible)", p.pipe.cfg.ConfirmTimeout)
	case wasReturned:
		o.Result = ResultUnroutable
		o.Reason = fmt.Sprintf("unroutable: %d %s (no queue bound to exchange %s for routing key %s)",
			ret.ReplyCode, ret.ReplyText, row.Exchange, row.RoutingKey)
	case s.confirm.Acked():
		o.Result = ResultConfirmed
		p.pipe.metrics.confirmLatency.Record(context.Background(), time.Since(s.publishedAt).Seconds())
	case p.ch.IsClosed():
		o.Result, o.Reason = ResultConnectionLost, "connection to RabbitMQ lost before the confirm"
	default:
		o.Result, o.Reason = ResultNacked, reasonNacked
	}
	return o
}

func isDone(dc *amqp.DeferredConfirmation) bool {
	select {
	case <-dc.Done():
		return true
	default:
		return false
	}
}
