package messaging

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/sync/semaphore"

	"github.com/yourorg/orders/internal/store"
)

// RelayConfig configures an outbox relay. Zero fields take the defaults
// noted on each.
type RelayConfig struct {
	// ID names this relay in claimed_by and in RabbitMQ's connection list.
	// Default: host name, process id and a random suffix.
	ID string
	// BatchSize is how many rows one claim takes. Default 500.
	BatchSize int
	// MaxInFlight caps the messages published and not yet confirmed (the
	// confirm window). Default 2000.
	MaxInFlight int
	// PollInterval is how often the relay looks for due rows without being
	// woken by NOTIFY (retries whose backoff ended, missed notifications),
	// and recovers expired leases. Default 1s.
	PollInterval time.Duration
	// Notify wakes the relay on LISTEN/NOTIFY as soon as rows commit.
	// Default on; NotifyOff turns it off (polling only).
	NotifyOff bool
	// Lease is how long a claimed row belongs to this relay; after that any
	// relay may take it back. Default 30s. Keep it well above
	// ConfirmTimeout.
	Lease time.Duration
	// ConfirmTimeout is how long to wait for the broker's confirm of a
	// message before treating the publish as failed. Default 10s.
	ConfirmTimeout time.Duration
	// MaxAttempts is how many publishes a row gets before it is FAILED.
	// Default 10.
	MaxAttempts int
	// BackoffBase and BackoffMax shape the delay before a failed row is
	// retried: about BackoffBase after the first failure, doubling, at most
	// BackoffMax. Defaults 1s and 5m.
	BackoffBase, BackoffMax time.Duration
	// ShutdownTimeout bounds the wait for outstanding confirms on stop;
	// rows still unconfirmed then are handed back. Default 15s.
	ShutdownTimeout time.Duration
	// Retention is how long PUBLISHED rows are kept; 0 keeps them forever.
	// Default 0 (the binary sets its own default).
	Retention time.Duration
}

func (c *RelayConfig) setDefaults() {
	if c.ID == "" {
		host, _ := os.Hostname()
		c.ID = fmt.Sprintf("%s-%d-%s", host, os.Getpid(), strconv.FormatInt(time.Now().UnixNano()%1e6, 36))
	}
	c.BatchSize = cmpOr(c.BatchSize, 500)
	c.MaxInFlight = cmpOr(c.MaxInFlight, 2000)
	c.PollInterval = cmpOr(c.PollInterval, time.Second)
	c.Lease = cmpOr(c.Lease, 30*time.Second)
	c.ConfirmTimeout = cmpOr(c.ConfirmTimeout, 10*time.Second)
	c.MaxAttempts = cmpOr(c.MaxAttempts, 10)
	c.BackoffBase = cmpOr(c.BackoffBase, time.Second)
	c.BackoffMax = cmpOr(c.BackoffMax, 5*time.Minute)
	c.ShutdownTimeout = cmpOr(c.ShutdownTimeout, 15*time.Second)
}

// Validate reports settings that cannot work together.
func (c *RelayConfig) Validate() error {
	var errs []error
	if c.BatchSize < 1 || c.MaxInFlight < 1 || c.MaxAttempts < 1 {
		errs = append(errs, errors.New("batch size, in-flight window and max attempts must be at least 1"))
	}
	if c.MaxInFlight < c.BatchSize {
		errs = append(errs, fmt.Errorf("the in-flight window (%d) must hold at least one batch (%d)", c.MaxInFlight, c.BatchSize))
	}
	if c.Lease <= c.ConfirmTimeout {
		errs = append(errs, fmt.Errorf("the lease (%s) must be longer than the confirm timeout (%s)", c.Lease, c.ConfirmTimeout))
	}
	if c.BackoffMax < c.BackoffBase {
		errs = append(errs, errors.New("the maximum backoff must not be below the base"))
	}
	if c.Retention < 0 {
		errs = append(errs, errors.New("retention must not be negative"))
	}
	return errors.Join(errs...)
}

func cmpOr[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// RelayDeps is what a relay runs on.
type RelayDeps struct {
	Pool           *pgxpool.Pool
	AMQPURL        string
	Logger         *slog.Logger
	MeterProvider  metric.MeterProvider
	TracerProvider trace.TracerProvider // default: the global one
}

// Relay publishes committed outbox rows. Run several at once if you like:
// claims never overlap (SKIP LOCKED) and a dead relay's rows come back
// when its lease ends.
type Relay struct {
	cfg     RelayConfig
	pool    *pgxpool.Pool
	url     string
	log     *slog.Logger
	metrics *relayMetrics
	tracer  trace.Tracer

	wake      chan struct{} // a rows-may-be-due signal; holds at most one
	connected atomic.Bool   // a confirm channel is open
	inFlight  atomic.Int64

	// beforeMark, when set (tests only), runs after the broker confirmed a
	// batch and before its rows are marked. An error stops the relay right
	// there, as a crash would.
	beforeMark func([]store.Claim) error
}

// errStopped ends Run on a beforeMark error: the test's stand-in for a crash.
var errStopped = errors.New("relay stopped before marking confirmed rows")

// NewRelay returns a relay; Run starts it.
func NewRelay(cfg RelayConfig, deps RelayDeps) (*Relay, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("relay config: %w", err)
	}
	r := &Relay{
		cfg:    cfg,
		pool:   deps.Pool,
		url:    deps.AMQPURL,
		log:    deps.Logger.With(slog.String("relay_id", cfg.ID)),
		wake:   make(chan struct{}, 1),
		tracer: tracerOf(deps.TracerProvider),
	}
	m, err := newRelayMetrics(deps.MeterProvider.Meter("github.com/yourorg/orders/internal/messaging"), r)
	if err != nil {
		return nil, err
	}
	r.metrics = m
	return r, nil
}

// ID is the relay's claimer id.
func (r *Relay) ID() string { return r.cfg.ID }

// Ready reports whether the relay can publish: it holds an open confirm
// channel and the database answers.
func (r *Relay) Ready(ctx context.Context) error {
	if !r.connected.Load() {
		return errors.New("not connected to RabbitMQ")
	}
	if err := r.pool.Ping(ctx); err != nil {
		return fmt.Errorf("database: %w", err)
	}
	return nil
}

// Run publishes until ctx ends, then stops claiming, waits up to
// ShutdownTimeout for the confirms of what it published, marks those rows,
// and hands the rest back. Lost broker connections are re-established with
// backoff; nothing claimed is lost meanwhile (its rows are marked failed
// and retried, or recovered when their lease ends).
func (r *Relay) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx) // ends the helpers below when Run returns
	defer cancel()
	if !r.cfg.NotifyOff {
		wg.Go(func() { r.listen(ctx) })
	}
	wg.Go(func() { r.maintain(ctx) })

	r.log.InfoContext(ctx, "relay starting", slog.Int("batch_size", r.cfg.BatchSize),
		slog.Int("max_in_flight", r.cfg.MaxInFlight), slog.Bool("notify", !r.cfg.NotifyOff))
	for failures := 0; ; {
		started := time.Now()
		err := r.session(ctx)
		if errors.Is(err, errStopped) {
			return err
		}
		if ctx.Err() != nil {
			r.log.InfoContext(ctx, "relay stopped")
			return nil
		}
		if time.Since(started) > time.Minute {
			failures = 0 // it ran a good while: start the backoff over
		}
		failures++
		delay := Backoff(failures, 500*time.Millisecond, 30*time.Second)
		r.log.WarnContext(ctx, "broker session ended; reconnecting",
			slog.String("error", errString(err)), slog.Duration("retry_in", delay))
		sleep(ctx, delay)
	}
}

// signal wakes the claim loop; a signal already pending absorbs this one.
func (r *Relay) signal() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// batch is one claim: its rows, published in order, their confirms, and
// the spans of the publishes (each in the trace of its row) and of the
// batch (linked to every row's trace).
type batch struct {
	rows        []store.OutboxRow
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
	returns     <-chan amqp.Return
	returned    map[string]amqp.Return // returns seen, by message id
	window      *semaphore.Weighted    // room for MaxInFlight unconfirmed messages
	inflight    chan *batch            // published batches, oldest first
	confirmDone chan struct{}          // closed when the confirm loop has exited
	stop        context.CancelCauseFunc
	blocked     atomic.Bool // the broker blocks publishers (a memory or disk alarm)
}

// session runs one broker connection until ctx ends or the channel fails.
func (r *Relay) session(ctx context.Context) error {
	conn, err := Dial(ctx, r.url, "outbox-relay "+r.cfg.ID)
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
	if err := DeclareExchange(ch); err != nil {
		return err
	}
	s := &session{
		Relay:       r,
		ch:          ch,
		returns:     ch.NotifyReturn(make(chan amqp.Return, 1024)),
		returned:    map[string]amqp.Return{},
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
	claimed := make(chan []store.OutboxRow, 1)
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
func (s *session) claimLoop(ctx context.Context, claimed chan<- []store.OutboxRow) {
	defer close(claimed)
	size := int64(s.cfg.BatchSize)
	dbFailures := 0
	for {
		// While the broker blocks publishers, claim nothing: the rows would
		// only wait for confirms that cannot come, and spend attempts.
		for s.blocked.Load() {
			if !sleep(ctx, 200*time.Millisecond) {
				return
			}
		}
		if err := s.window.Acquire(ctx, size); err != nil {
			return
		}
		rows, err := store.ClaimOutbox(ctx, s.pool, s.cfg.ID, s.cfg.BatchSize, s.cfg.Lease)
		if err != nil {
			s.window.Release(size)
			if ctx.Err() != nil {
				return
			}
			dbFailures++
			delay := Backoff(dbFailures, 200*time.Millisecond, 10*time.Second)
			s.log.WarnContext(ctx, "claiming outbox rows failed", slog.String("error", err.Error()), slog.Duration("retry_in", delay))
			sleep(ctx, delay)
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
func (s *session) publishLoop(ctx context.Context, claimed <-chan []store.OutboxRow) {
	defer close(s.inflight)
	for rows := range claimed {
		b := &batch{rows: rows, confirms: make([]*amqp.DeferredConfirmation, 0, len(rows)), spans: make([]trace.Span, 0, len(rows))}
		parents := make([]context.Context, len(rows))
		links := make([]trace.Link, len(rows))
		for i, row := range rows {
			parents[i] = extract(context.Background(), propagation.MapCarrier(row.Headers))
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

// outcome is what became of one claimed row.
type outcome struct {
	row    store.OutboxRow
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

// confirmLoop waits for the confirms of each batch, in order, and marks its
// rows: confirmed ones PUBLISHED; returned, nacked and timed-out ones back
// to PENDING (or FAILED); and, when ctx ends first (the shutdown deadline),
// unconfirmed ones handed back untried. A confirm that never comes means
// the channel cannot be trusted: stop ends the session, and the loop goes
// on marking what is still in flight.
func (s *session) confirmLoop(ctx context.Context, stop context.CancelCauseFunc) error {
	var fatal error
	for b := range s.inflight {
		outcomes := s.awaitConfirms(ctx, b)
		endSpans(b, outcomes)
		err := s.mark(outcomes)
		s.window.Release(int64(len(b.rows)))
		s.inFlight.Add(-int64(len(b.rows)))
		if err != nil {
			return err
		}
		for _, o := range outcomes {
			if o.result == outcomeTimeout && fatal == nil {
				fatal = errors.New("publisher confirm timed out")
				stop(fatal)
			}
		}
	}
	return fatal
}

// awaitConfirms waits for each confirm of batch b until its confirm
// deadline or the shutdown deadline (ctx), and says what became of each row.
func (s *session) awaitConfirms(ctx context.Context, b *batch) []outcome {
	deadline := time.NewTimer(time.Until(b.publishedAt.Add(s.cfg.ConfirmTimeout)))
	defer deadline.Stop()
	outcomes := make([]outcome, len(b.rows))
	timedOut, stopping := false, false
	for i, row := range b.rows {
		o := &outcomes[i]
		o.row = row
		if i >= len(b.confirms) {
			o.result, o.reason = outcomeNotPublished, "not published: the channel closed first"
			continue
		}
		dc := b.confirms[i]
	wait:
		for !timedOut && !stopping {
			select {
			case ret, ok := <-s.returns:
				s.keepReturn(ret, ok)
			case <-dc.Done():
				break wait
			case <-deadline.C:
				timedOut = true
			case <-ctx.Done():
				stopping = true
			}
		}
		if !isDone(dc) {
			if stopping {
				o.result, o.reason = outcomeShutdown, "no confirm before shutdown"
			} else {
				o.result = outcomeTimeout
				o.reason = fmt.Sprintf("no publisher confirm within %s (the broker may have the message: a duplicate is possible)", s.cfg.ConfirmTimeout)
			}
			continue
		}
		// RabbitMQ sends basic.return before the ack of the same message, and
		// the client hands the return over before it resolves the confirm:
		// by now a return for this message is in the map or the channel.
		s.drainReturns()
		msgID := row.ID.String()
		ret, wasReturned := s.returned[msgID]
		delete(s.returned, msgID)
		switch {
		case wasReturned:
			o.result = outcomeUnroutable
			o.reason = fmt.Sprintf("unroutable: %d %s (no queue bound to exchange %s for routing key %s)",
				ret.ReplyCode, ret.ReplyText, row.Exchange, row.RoutingKey)
		case dc.Acked():
			o.result = outcomeConfirmed
			s.metrics.confirmLatency.Record(context.Background(), time.Since(b.publishedAt).Seconds())
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
		span.SetAttributes(attrOutcome.String(outcomes[i].result))
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

func (s *session) drainReturns() {
	for s.returns != nil {
		select {
		case ret, ok := <-s.returns:
			s.keepReturn(ret, ok)
		default:
			return
		}
	}
}

// keepReturn notes a returned message; when the channel has closed (ok is
// false) it stops listening for returns.
func (s *session) keepReturn(ret amqp.Return, ok bool) {
	if !ok {
		s.returns = nil // a nil channel never fires in a select
		return
	}
	s.returned[ret.MessageId] = ret
}

func isDone(dc *amqp.DeferredConfirmation) bool {
	select {
	case <-dc.Done():
		return true
	default:
		return false
	}
}

// mark writes the outcomes of a batch to the database: one statement for
// the published rows, one for the failed ones, one for those handed back.
func (r *Relay) mark(outcomes []outcome) error {
	var (
		published []store.Claim
		failed    []store.PublishFailure
		released  []store.Claim
	)
	ctx := context.Background()
	for _, o := range outcomes {
		attrs := metric.WithAttributes(attrType.String(o.row.Type), attrOutcome.String(o.result))
		r.metrics.attempts.Add(ctx, 1, attrs)
		switch o.result {
		case outcomeConfirmed:
			published = append(published, o.row.Claim())
		case outcomeShutdown, outcomeNotPublished:
			released = append(released, o.row.Claim())
		default:
			if o.result == outcomeUnroutable {
				r.metrics.unroutable.Add(ctx, 1, metric.WithAttributes(attrType.String(o.row.Type)))
			}
			failed = append(failed, store.PublishFailure{
				Claim: o.row.Claim(), Reason: o.reason,
				RetryIn: Backoff(o.row.Attempt, r.cfg.BackoffBase, r.cfg.BackoffMax),
			})
		}
	}
	if r.beforeMark != nil {
		if err := r.beforeMark(published); err != nil {
			return fmt.Errorf("%w: %w", errStopped, err)
		}
	}

	return r.withDBRetry(func(ctx context.Context) error {
		n, err := store.MarkOutboxPublished(ctx, r.pool, published)
		if err != nil {
			return err
		}
		if lost := int64(len(published)) - n; lost > 0 {
			r.log.WarnContext(ctx, "confirmed rows no longer held by this relay (lease expired); they will be published again",
				slog.Int64("rows", lost))
		}
		for _, o := range outcomes {
			if o.result == outcomeConfirmed {
				r.metrics.published.Add(ctx, 1, metric.WithAttributes(attrType.String(o.row.Type)))
				r.metrics.publishDelay.Record(ctx, time.Since(o.row.CreatedAt).Seconds())
				r.metrics.attemptsPerMessage.Record(ctx, int64(o.row.Attempt))
			}
		}
		failedIDs, err := store.MarkOutboxFailed(ctx, r.pool, failed, r.cfg.MaxAttempts)
		if err != nil {
			return err
		}
		r.logFailures(ctx, outcomes)
		for _, id := range failedIDs {
			r.metrics.failed.Add(ctx, 1)
			r.log.ErrorContext(ctx, "outbox row FAILED: attempts exhausted", slog.String("message_id", id.String()),
				slog.Int("max_attempts", r.cfg.MaxAttempts))
		}
		_, err = store.ReleaseOutboxClaims(ctx, r.pool, released)
		return err
	})
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

// withDBRetry runs f until it succeeds, a few times with backoff. If the
// database stays away, the rows stay PUBLISHING and come back when their
// lease ends: published again (a duplicate the inbox absorbs), never lost.
func (r *Relay) withDBRetry(f func(context.Context) error) error {
	var err error
	for attempt := 1; attempt <= 5; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err = f(ctx)
		cancel()
		if err == nil {
			return nil
		}
		r.log.Warn("marking outbox rows failed", slog.String("error", err.Error()), slog.Int("attempt", attempt))
		time.Sleep(Backoff(attempt, 200*time.Millisecond, 5*time.Second))
	}
	r.log.Error("giving up marking outbox rows; their leases will bring them back", slog.String("error", err.Error()))
	return nil
}

// maintain runs the relay's clock: the poll tick (a wake-up in case a
// NOTIFY was missed or a retry came due), lease recovery, and retention.
func (r *Relay) maintain(ctx context.Context) {
	poll := time.NewTicker(r.cfg.PollInterval)
	defer poll.Stop()
	cleanup := time.NewTicker(time.Minute)
	defer cleanup.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-poll.C:
			r.signal()
			n, err := store.RecoverExpiredOutboxClaims(ctx, r.pool, r.cfg.MaxAttempts)
			if err != nil && ctx.Err() == nil {
				r.log.WarnContext(ctx, "recovering expired claims failed", slog.String("error", err.Error()))
			}
			if n > 0 {
				r.metrics.recovered.Add(ctx, n)
				r.log.WarnContext(ctx, "recovered outbox rows whose relay lease expired", slog.Int64("rows", n))
			}
		case <-cleanup.C:
			r.deletePublished(ctx)
		}
	}
}

func (r *Relay) deletePublished(ctx context.Context) {
	if r.cfg.Retention == 0 {
		return
	}
	const batchRows = 1000
	for {
		n, err := store.DeletePublishedOutbox(ctx, r.pool, r.cfg.Retention, batchRows)
		if err != nil {
			if ctx.Err() == nil {
				r.log.WarnContext(ctx, "deleting published outbox rows failed", slog.String("error", err.Error()))
			}
			return
		}
		if n < batchRows {
			return
		}
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
