package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.32.0"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/sync/semaphore"

	"github.com/yourorg/orders/internal/background"
	"github.com/yourorg/orders/internal/messaging"
)

// session is one broker connection's worth of publishing: one channel in
// confirm mode, and the pipeline that claims, publishes, awaits confirms
// and marks (run).
type session struct {
	relay   *Relay
	ch      *amqp.Channel
	returns *returnBook         // the broker's basic.returns, kept until their confirm is read
	window  *semaphore.Weighted // room for MaxInFlight unconfirmed messages
	blocked atomic.Bool         // the broker blocks publishers (a memory or disk alarm)
	stop    context.CancelCauseFunc
}

// batch is one claim: its rows, published in order, their confirms, and
// the spans of the publishes (each in the trace of its row) and of the
// batch (linked to every row's trace).
type batch struct {
	rows        []Row
	confirms    []*amqp.DeferredConfirmation // one per published row, in order
	spans       []trace.Span                 // one per published row, in order
	batchSpan   trace.Span
	publishedAt time.Time
}

func newSession(r *Relay) *session {
	return &session{relay: r, window: semaphore.NewWeighted(int64(r.cfg.MaxInFlight))}
}

// run is the relay's pipeline over one broker connection, until ctx ends
// or the channel fails. Every batch goes through four steps, in this order:
//
//  1. claim    due rows, leased to this relay (ClaimRows)       claimLoop
//  2. publish  each row, mandatory, confirms pipelined          publishLoop
//  3. confirm  wait for the broker's answer to each row         confirmLoop
//  4. mark     every row by that answer, in one statement      confirmLoop -> Relay.mark
//
// The steps run in goroutines of their own, joined by channels, so that
// they overlap: the next batch is claimed while this one is published, and
// confirms are awaited while later batches go out. At most MaxInFlight
// messages wait for their confirm (the window). On shutdown, claiming
// stops at once; the confirm loop goes on for up to ShutdownTimeout,
// marking what the broker confirms and handing back the rest.
func (s *session) run(ctx context.Context) error {
	r := s.relay
	conn, ch, err := messaging.Open(ctx, r.url, "outbox-relay "+r.cfg.ID)
	if err != nil {
		return err
	}
	// A stalled broker never answers connection.close: do not wait for it.
	defer func() { _ = conn.CloseDeadline(time.Now().Add(time.Second)) }()
	if err := ch.Confirm(false); err != nil {
		return fmt.Errorf("confirm mode: %w", err)
	}
	s.ch, s.returns = ch, newReturnBook(ch)

	// sessCtx ends the claim and publish steps: on shutdown, when the
	// channel dies, or when the confirm step gives up on the channel.
	sessCtx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	s.stop = stop
	go s.watchChannel(ch.NotifyClose(make(chan *amqp.Error, 1)))
	go s.watchBlocked(ctx, conn.NotifyBlocked(make(chan amqp.Blocking, 4)))

	// Before anything is published, and at every poll: are all the
	// readers' queues there? A type one of whose readers has none is held.
	r.lookForReaders(ctx, conn)
	go s.watchReaders(sessCtx, conn)

	r.connected.Store(true)
	defer r.connected.Store(false)
	r.log.InfoContext(ctx, "connected to RabbitMQ")
	r.signal() // sweep: rows may have committed while we were away

	// drainCtx bounds the confirm step, which runs on after shutdown begins
	// for at most ShutdownTimeout.
	drainCtx, cancelDrain := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelDrain()
	stopTimer := context.AfterFunc(ctx, func() { time.AfterFunc(r.cfg.ShutdownTimeout, cancelDrain) })
	defer stopTimer()

	claimed := make(chan []Row, 1)                    // 1 -> 2
	published := make(chan *batch, r.cfg.MaxInFlight) // 2 -> 3
	confirmDone := make(chan struct{})                // 3 has stopped
	confirmErr := make(chan error, 1)
	go func() {
		defer close(confirmDone)
		err := s.confirmLoop(drainCtx, published)
		if err != nil {
			stop(err)
		}
		confirmErr <- err
	}()
	go s.publishLoop(sessCtx, claimed, published, confirmDone)
	s.claimLoop(sessCtx, claimed)

	err = <-confirmErr
	if errors.Is(err, errStopped) {
		return err
	}
	if ctx.Err() != nil {
		return nil
	}
	if err == nil {
		err = context.Cause(sessCtx)
	}
	return err
}

// watchChannel ends the session when the broker closes the channel.
func (s *session) watchChannel(closed <-chan *amqp.Error) {
	if amqpErr, ok := <-closed; ok {
		s.stop(fmt.Errorf("channel closed: %w", amqpErr))
	}
}

// watchReaders looks for the readers' queues at every poll, until ctx
// ends.
func (s *session) watchReaders(ctx context.Context, conn *amqp.Connection) {
	r := s.relay
	if len(r.cfg.Readers) == 0 {
		return
	}
	tick := time.NewTicker(r.cfg.PollInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			r.lookForReaders(ctx, conn)
		}
	}
}

// watchBlocked pauses claiming while the broker blocks publishers (a
// memory or disk alarm).
func (s *session) watchBlocked(ctx context.Context, blocked <-chan amqp.Blocking) {
	r := s.relay
	for b := range blocked {
		s.blocked.Store(b.Active)
		if b.Active {
			r.log.WarnContext(ctx, "RabbitMQ blocked publishing (resource alarm); claiming paused", slog.String("reason", b.Reason))
		} else {
			r.log.InfoContext(ctx, "RabbitMQ unblocked publishing; claiming again")
			r.signal()
		}
	}
}

// claimLoop is step 1: it claims due rows while the window has room, until
// ctx ends, and hands each batch to the publish step. It never waits for a
// confirm.
func (s *session) claimLoop(ctx context.Context, claimed chan<- []Row) {
	defer close(claimed)
	r := s.relay
	size := int64(r.cfg.BatchSize)
	dbFailures := 0
	for {
		// While the broker blocks publishers, claim nothing: the rows would
		// only wait for confirms that cannot come, and spend attempts.
		for s.blocked.Load() {
			if !background.Sleep(ctx, 200*time.Millisecond) {
				return
			}
		}
		if err := s.window.Acquire(ctx, size); err != nil {
			return
		}
		scope := r.scope()
		var rows []Row
		var err error
		if !scope.claimsNothing() { // a relay that holds no partition yet waits for the next poll
			// The end of the session does not cut a claim short: a claim
			// cancelled in flight may have committed all the same, and its
			// rows would wait for their lease (RELAY_LEASE) unseen. It runs
			// to its end (DBTimeout at most), and what it claimed goes on to
			// the publish step, which hands it back unpublished.
			claimCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.DBTimeout)
			rows, err = claimRows(claimCtx, r.pool, r.cfg.ID, r.cfg.BatchSize, r.cfg.Lease, scope)
			cancel()
		}
		if err != nil {
			s.window.Release(size)
			if ctx.Err() != nil {
				return
			}
			dbFailures++
			delay := background.Backoff(dbFailures, 200*time.Millisecond, 10*time.Second)
			r.log.WarnContext(ctx, "claiming outbox rows failed", slog.String("error", err.Error()), slog.Duration("retry_in", delay))
			background.Sleep(ctx, delay)
			continue
		}
		dbFailures = 0
		s.window.Release(size - int64(len(rows)))
		if len(rows) == 0 {
			select { // nothing due: wait for a NOTIFY or the poll tick
			case <-r.wake:
			case <-ctx.Done():
				return
			}
			continue
		}
		r.inFlight.Add(int64(len(rows)))
		r.metrics.batchSize.Record(context.Background(), int64(len(rows)))
		claimed <- rows // the publish step takes every batch, published or not
	}
}

// publishLoop is step 2: it publishes each claimed batch on the channel, in
// order, and hands it to the confirm step. Once ctx has ended (shutdown, or
// the channel failed) it publishes nothing more: the batches still coming
// are passed on unpublished, to be handed back.
func (s *session) publishLoop(ctx context.Context, claimed <-chan []Row, published chan<- *batch, confirmDone <-chan struct{}) {
	defer close(published)
	r := s.relay
	for rows := range claimed {
		b := &batch{rows: rows, confirms: make([]*amqp.DeferredConfirmation, 0, len(rows)), spans: make([]trace.Span, 0, len(rows))}
		parents := make([]context.Context, len(rows))
		links := make([]trace.Link, len(rows))
		for i, row := range rows {
			parents[i] = messaging.Extract(context.Background(), propagation.MapCarrier(row.Headers))
			links[i] = trace.Link{SpanContext: trace.SpanContextFromContext(parents[i])}
		}
		_, b.batchSpan = r.tracer.Start(context.Background(), "publish batch", trace.WithSpanKind(trace.SpanKindProducer),
			trace.WithLinks(links...), trace.WithAttributes(semconv.MessagingSystemRabbitMQ, semconv.MessagingOperationTypeSend,
				semconv.MessagingBatchMessageCount(len(rows))))
		b.publishedAt = time.Now()
		for i, row := range rows {
			if ctx.Err() != nil {
				break
			}
			msg := Publishing(row)
			span := publishSpan(r.tracer, parents[i], &msg, row.Exchange, row.RoutingKey)
			dc, err := s.ch.PublishWithDeferredConfirmWithContext(ctx, row.Exchange, row.RoutingKey, true, false, msg)
			if err != nil {
				span.End()
				if ctx.Err() == nil {
					r.log.WarnContext(ctx, "publish failed; ending the session", slog.String("error", err.Error()))
				}
				s.stop(fmt.Errorf("publish: %w", err))
				break
			}
			b.confirms = append(b.confirms, dc)
			b.spans = append(b.spans, span)
		}
		select {
		case published <- b:
		case <-confirmDone: // the confirm step stopped (a crash, in tests): the leases bring the rows back
			for range claimed {
			}
			return
		}
	}
}
