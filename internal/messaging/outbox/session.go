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

// session is one broker connection's worth of publishing: one channel in
// confirm mode, a claim loop that publishes, and a confirm loop that marks.
type session struct {
	*Relay
	ch          *amqp.Channel
	returns     *returnBook
	window      *semaphore.Weighted // room for MaxInFlight unconfirmed messages
	inflight    chan *batch         // published batches, oldest first
	confirmDone chan struct{}       // closed when the confirm loop has exited
	stop        context.CancelCauseFunc
	blocked     atomic.Bool // the broker blocks publishers (a memory or disk alarm)
}

// session runs one broker connection until ctx ends or the channel fails.
func (r *Relay) session(ctx context.Context) error {
	conn, err := messaging.Dial(ctx, r.url, "outbox-relay "+r.cfg.ID)
	if err != nil {
		return err
	}
	// A stalled broker never answers connection.close: do not wait for it.
	defer func() { _ = conn.CloseDeadline(time.Now().Add(time.Second)) }()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		return fmt.Errorf("confirm mode: %w", err)
	}
	if err := messaging.DeclareExchange(ch); err != nil {
		return err
	}
	s := &session{
		Relay:       r,
		ch:          ch,
		returns:     newReturnBook(ch),
		window:      semaphore.NewWeighted(int64(r.cfg.MaxInFlight)),
		inflight:    make(chan *batch, r.cfg.MaxInFlight),
		confirmDone: make(chan struct{}),
	}
	chClosed := ch.NotifyClose(make(chan *amqp.Error, 1))
	blocked := conn.NotifyBlocked(make(chan amqp.Blocking, 4))

	// sessCtx ends the claim loop: on shutdown, when the channel dies, or
	// when the confirm loop gives up on the channel.
	sessCtx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	s.stop = stop
	go func() {
		if amqpErr, ok := <-chClosed; ok {
			stop(fmt.Errorf("channel closed: %w", amqpErr))
		}
	}()
	go func() {
		for b := range blocked {
			s.blocked.Store(b.Active)
			if b.Active {
				r.log.WarnContext(ctx, "RabbitMQ blocked publishing (resource alarm); claiming paused", slog.String("reason", b.Reason))
			} else {
				r.log.InfoContext(ctx, "RabbitMQ unblocked publishing; claiming again")
				r.signal()
			}
		}
	}()

	r.connected.Store(true)
	defer r.connected.Store(false)
	r.log.InfoContext(ctx, "connected to RabbitMQ")
	r.signal() // sweep: rows may have committed while we were away

	// drainCtx bounds the confirm loop, which runs on after shutdown begins
	// for at most ShutdownTimeout.
	drainCtx, cancelDrain := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelDrain()
	stopTimer := context.AfterFunc(ctx, func() { time.AfterFunc(r.cfg.ShutdownTimeout, cancelDrain) })
	defer stopTimer()

	confirmErr := make(chan error, 1)
	go func() {
		defer close(s.confirmDone)
		err := s.confirmLoop(drainCtx, stop)
		if err != nil {
			stop(err)
		}
		confirmErr <- err
	}()
	claimed := make(chan []Row, 1)
	go s.publishLoop(sessCtx, claimed)
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

// claimLoop claims due rows while the window has room, until ctx ends, and
// hands each batch to the publish loop. Claiming the next batch overlaps
// publishing this one; neither waits for a confirm.
func (s *session) claimLoop(ctx context.Context, claimed chan<- []Row) {
	defer close(claimed)
	size := int64(s.cfg.BatchSize)
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
		claimCtx, cancel := context.WithTimeout(ctx, s.cfg.DBTimeout)
		rows, err := ClaimRows(claimCtx, s.pool, s.cfg.ID, s.cfg.BatchSize, s.cfg.Lease)
		cancel()
		if err != nil {
			s.window.Release(size)
			if ctx.Err() != nil {
				return
			}
			dbFailures++
			delay := background.Backoff(dbFailures, 200*time.Millisecond, 10*time.Second)
			s.log.WarnContext(ctx, "claiming outbox rows failed", slog.String("error", err.Error()), slog.Duration("retry_in", delay))
			background.Sleep(ctx, delay)
			continue
		}
		dbFailures = 0
		s.window.Release(size - int64(len(rows)))
		if len(rows) == 0 {
			select { // nothing due: wait for a NOTIFY or the poll tick
			case <-s.wake:
			case <-ctx.Done():
				return
			}
			continue
		}
		s.inFlight.Add(int64(len(rows)))
		s.metrics.batchSize.Record(context.Background(), int64(len(rows)))
		claimed <- rows // the publish loop takes every batch, published or not
	}
}

// publishLoop publishes each claimed batch on the channel, in order, and
// hands it to the confirm loop. Once ctx has ended (shutdown, or the
// channel failed) it publishes nothing more: the batches still coming are
// passed on unpublished, to be handed back.
func (s *session) publishLoop(ctx context.Context, claimed <-chan []Row) {
	defer close(s.inflight)
	for rows := range claimed {
		b := &batch{rows: rows, confirms: make([]*amqp.DeferredConfirmation, 0, len(rows)), spans: make([]trace.Span, 0, len(rows))}
		parents := make([]context.Context, len(rows))
		links := make([]trace.Link, len(rows))
		for i, row := range rows {
			parents[i] = messaging.Extract(context.Background(), propagation.MapCarrier(row.Headers))
			links[i] = trace.Link{SpanContext: trace.SpanContextFromContext(parents[i])}
		}
		_, b.batchSpan = s.tracer.Start(context.Background(), "publish batch", trace.WithSpanKind(trace.SpanKindProducer),
			trace.WithLinks(links...), trace.WithAttributes(semconv.MessagingSystemRabbitMQ, semconv.MessagingOperationTypeSend,
				semconv.MessagingBatchMessageCount(len(rows))))
		b.publishedAt = time.Now()
		for i, row := range rows {
			if ctx.Err() != nil {
				break
			}
			msg := Publishing(row)
			span := publishSpan(s.tracer, parents[i], &msg, row.Exchange, row.RoutingKey)
			dc, err := s.ch.PublishWithDeferredConfirmWithContext(ctx, row.Exchange, row.RoutingKey, true, false, msg)
			if err != nil {
				span.End()
				if ctx.Err() == nil {
					s.log.WarnContext(ctx, "publish failed; ending the session", slog.String("error", err.Error()))
				}
				s.stop(fmt.Errorf("publish: %w", err))
				break
			}
			b.confirms = append(b.confirms, dc)
			b.spans = append(b.spans, span)
		}
		select {
		case s.inflight <- b:
		case <-s.confirmDone: // the confirm loop stopped (a crash, in tests): the leases bring the rows back
			for range claimed {
			}
			return
		}
	}
}
