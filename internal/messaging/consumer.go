package messaging

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/yourorg/orders/internal/domain"
	"github.com/yourorg/orders/internal/store"
	"github.com/yourorg/orders/internal/telemetry"
)

// ConsumerConfig configures the consumers of a process. Zero fields take
// the defaults noted on each.
type ConsumerConfig struct {
	// Prefetch is how many unacknowledged deliveries the broker sends each
	// consumer at once. Default 32.
	Prefetch int
	// Workers is how many deliveries each consumer processes at once.
	// Default 8.
	Workers int
	// MaxAttempts is how many times a transient failure is retried before
	// the message is parked as poison. Default 5.
	MaxAttempts int
	// RetryDelays are the waits before the retries, growing; the last one
	// repeats. Default 1s, 5s, 30s, 2m.
	RetryDelays []time.Duration
	// DeliveryLimit is the work queues' x-delivery-limit: redeliveries
	// (crashes, nacks) after which the broker parks a message. Default 20.
	DeliveryLimit int
	// ProcessingLease is how long a message may stay PROCESSING between the
	// two steps of an external side effect before another delivery takes it
	// over. Default 1m.
	ProcessingLease time.Duration
	// ShutdownTimeout bounds the wait for the deliveries in progress on
	// stop; what is not done then is left unacknowledged for redelivery.
	// Default 15s.
	ShutdownTimeout time.Duration
	// InboxRetention is how long PROCESSED inbox rows are kept: at least
	// as long as a message may be delivered or replayed again. 0 keeps them
	// forever.
	InboxRetention time.Duration
	// Producer is the app_id of the follow-up messages. Default
	// "order-consumer".
	Producer string
}

func (c *ConsumerConfig) setDefaults() {
	c.Prefetch = cmpOr(c.Prefetch, 32)
	c.Workers = cmpOr(c.Workers, 8)
	c.MaxAttempts = cmpOr(c.MaxAttempts, 5)
	if len(c.RetryDelays) == 0 {
		c.RetryDelays = []time.Duration{time.Second, 5 * time.Second, 30 * time.Second, 2 * time.Minute}
	}
	c.DeliveryLimit = cmpOr(c.DeliveryLimit, 20)
	c.ProcessingLease = cmpOr(c.ProcessingLease, time.Minute)
	c.ShutdownTimeout = cmpOr(c.ShutdownTimeout, 15*time.Second)
	c.Producer = cmpOr(c.Producer, "order-consumer")
}

// Validate reports settings that cannot work.
func (c *ConsumerConfig) Validate() error {
	var errs []error
	if c.Prefetch < 1 || c.Workers < 1 || c.MaxAttempts < 1 || c.DeliveryLimit < 1 {
		errs = append(errs, errors.New("prefetch, workers, max attempts and delivery limit must be at least 1"))
	}
	for _, d := range c.RetryDelays {
		if d < time.Millisecond {
			errs = append(errs, fmt.Errorf("retry delay %s is shorter than a millisecond", d))
		}
	}
	if !slices.IsSorted(c.RetryDelays) {
		errs = append(errs, errors.New("retry delays must grow"))
	}
	if c.InboxRetention < 0 {
		errs = append(errs, errors.New("inbox retention must not be negative"))
	}
	return errors.Join(errs...)
}

// ConsumerSpec is one consumer: its name (the inbox's consumer_name and its
// queue), the message types it is bound to, and its handler.
type ConsumerSpec struct {
	Name    string
	Types   []string
	Handler Handler
}

// ConsumerDeps is what the consumers run on.
type ConsumerDeps struct {
	Pool           *pgxpool.Pool
	AMQPURL        string
	Logger         *slog.Logger
	MeterProvider  metric.MeterProvider
	TracerProvider trace.TracerProvider // default: the global one
}

// Consumers runs the consumers of a process, each on its own connection,
// and the inbox housekeeping they share.
type Consumers struct {
	cfg       ConsumerConfig
	deps      ConsumerDeps
	consumers []*consumer
	metrics   *consumerMetrics
	tracer    trace.Tracer

	// afterCommit, when set (tests only), runs after a delivery's
	// transaction committed and before its ack: the crash window.
	afterCommit func(*Delivery)
	// crashAfterCommit, when set, names a message type: the next delivery of
	// that type exits the process between its commit and its ack (see
	// CrashAfterCommit). exit is os.Exit, or a stand-in in tests.
	crashAfterCommit atomic.Pointer[string]
	exit             func(code int)
}

// CrashAfterCommit arms a one-shot fault, for demonstrations (the
// walkthrough) and drills: the next delivery of messageType that commits
// makes the process exit at once, before its ack, as a crash in the worst
// place would. The broker then delivers the message again, and the inbox
// turns the redelivery into a duplicate. Off unless asked for; the admin
// endpoint that arms it exists only with CONSUMER_FAULTS_ENDPOINT=true.
func (cs *Consumers) CrashAfterCommit(messageType string) {
	cs.crashAfterCommit.Store(&messageType)
}

// consumer is one consumer's loop.
type consumer struct {
	*Consumers
	spec      ConsumerSpec
	topology  Topology
	log       *slog.Logger
	consuming atomic.Bool
}

// NewConsumers prepares the consumers of specs; Run starts them.
func NewConsumers(cfg ConsumerConfig, deps ConsumerDeps, specs ...ConsumerSpec) (*Consumers, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("consumer config: %w", err)
	}
	cs := &Consumers{cfg: cfg, deps: deps, tracer: tracerOf(deps.TracerProvider), exit: os.Exit}
	m, err := newConsumerMetrics(deps.MeterProvider.Meter("github.com/yourorg/orders/internal/messaging"), cs)
	if err != nil {
		return nil, err
	}
	cs.metrics = m
	for _, s := range specs {
		m.zero(s)
		cs.consumers = append(cs.consumers, &consumer{
			Consumers: cs,
			spec:      s,
			topology:  Topology{Consumer: s.Name, Types: s.Types, RetryDelays: cfg.RetryDelays, DeliveryLimit: cfg.DeliveryLimit},
			log:       deps.Logger.With(slog.String("consumer_name", s.Name)),
		})
	}
	return cs, nil
}

// Ready reports whether every consumer is consuming and the database
// answers.
func (cs *Consumers) Ready(ctx context.Context) error {
	for _, c := range cs.consumers {
		if !c.consuming.Load() {
			return fmt.Errorf("consumer %s is not consuming", c.spec.Name)
		}
	}
	if err := cs.deps.Pool.Ping(ctx); err != nil {
		return fmt.Errorf("database: %w", err)
	}
	return nil
}

// Run consumes until ctx ends. Then each consumer stops taking deliveries,
// finishes those in progress (for at most ShutdownTimeout) and leaves the
// rest unacknowledged, for the broker to deliver again.
func (cs *Consumers) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	for _, c := range cs.consumers {
		wg.Go(func() { c.run(ctx) })
	}
	wg.Go(func() { cs.housekeeping(ctx) })
	wg.Wait()
	return nil
}

func (c *consumer) run(ctx context.Context) {
	c.log.InfoContext(ctx, "consumer starting", slog.String("queue", QueueName(c.spec.Name)),
		slog.Int("workers", c.cfg.Workers), slog.Int("prefetch", c.cfg.Prefetch))
	for failures := 0; ; {
		started := time.Now()
		err := c.session(ctx)
		if ctx.Err() != nil {
			c.log.InfoContext(ctx, "consumer stopped")
			return
		}
		if time.Since(started) > time.Minute {
			failures = 0
		}
		failures++
		delay := Backoff(failures, 500*time.Millisecond, 30*time.Second)
		c.log.WarnContext(ctx, "broker session ended; reconnecting", slog.String("error", errString(err)), slog.Duration("retry_in", delay))
		sleep(ctx, delay)
	}
}

// session is the life of one broker connection: declare the topology,
// consume with Workers goroutines, stop on shutdown or when the channel
// dies.
func (c *consumer) session(ctx context.Context) error {
	conn, err := Dial(ctx, c.deps.AMQPURL, "order-consumer "+c.spec.Name)
	if err != nil {
		return err
	}
	defer func() { _ = conn.CloseDeadline(time.Now().Add(time.Second)) }()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	if err := c.topology.Declare(ch); err != nil {
		return err
	}
	if err := ch.Qos(c.cfg.Prefetch, 0, false); err != nil {
		return fmt.Errorf("set prefetch: %w", err)
	}
	pub, err := newConfirmPublisher(conn)
	if err != nil {
		return err
	}
	tag := fmt.Sprintf("%s-%d-%d", c.spec.Name, os.Getpid(), time.Now().UnixNano())
	deliveries, err := ch.Consume(QueueName(c.spec.Name), tag, false, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("consume %s: %w", QueueName(c.spec.Name), err)
	}
	chClosed := ch.NotifyClose(make(chan *amqp.Error, 1))
	c.consuming.Store(true)
	defer c.consuming.Store(false)
	c.log.InfoContext(ctx, "consuming", slog.String("queue", QueueName(c.spec.Name)))

	// workCtx bounds the processing: it ends ShutdownTimeout after ctx.
	workCtx, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	stopTimer := context.AfterFunc(ctx, func() { time.AfterFunc(c.cfg.ShutdownTimeout, cancelWork) })
	defer stopTimer()
	stopTaking := make(chan struct{})

	var wg sync.WaitGroup
	for range c.cfg.Workers {
		wg.Go(func() {
			for {
				select { // stopping wins over a delivery that is ready too
				case <-stopTaking:
					return // what is still buffered stays unacknowledged
				default:
				}
				select {
				case <-stopTaking:
					return
				case raw, ok := <-deliveries:
					if !ok {
						return
					}
					c.handle(workCtx, pub, raw)
				}
			}
		})
	}

	var sessionErr error
	select {
	case <-ctx.Done():
		_ = ch.Cancel(tag, false) // no more deliveries
	case amqpErr := <-chClosed:
		sessionErr = fmt.Errorf("channel closed: %w", amqpErr)
	}
	close(stopTaking)
	wg.Wait()
	return sessionErr
}

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
func (c *consumer) handle(ctx context.Context, pub *confirmPublisher, raw amqp.Delivery) {
	start := time.Now()
	ctx, span := processSpan(ctx, c.tracer, raw, QueueName(c.spec.Name), c.spec.Name)
	defer span.End()
	d, err := parseDelivery(raw)
	if sc := span.SpanContext(); sc.IsValid() {
		d.TraceID = sc.TraceID().String() // every inbox row names its trace
	}
	attrs := metric.WithAttributes(attrConsumer.String(c.spec.Name), attrType.String(d.Type))
	c.metrics.received.Add(ctx, 1, attrs)
	if raw.Redelivered {
		c.metrics.redelivered.Add(ctx, 1, attrs)
	}
	ctx = telemetry.WithLogAttrs(ctx, slog.String("message_id", d.MessageID),
		slog.String("message_type", d.Type), slog.String("correlation_id", d.CorrelationID), slog.String("order_id", d.OrderID()),
		slog.Int("attempt", d.Attempt), slog.Bool("redelivered", raw.Redelivered))
	if err == nil && !slices.Contains(c.spec.Types, d.Type) {
		err = Permanent("unexpected_type", fmt.Errorf("consumer %s does not handle %s", c.spec.Name, d.Type))
	}
	var res result
	if err == nil {
		res, err = c.apply(ctx, d)
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
	c.metrics.duration.Record(ctx, took.Seconds(), metric.WithAttributes(attrConsumer.String(c.spec.Name), attrOutcome.String(res.outcome)))
	span.SetAttributes(attrOutcome.String(res.outcome))
	logAttrs := []any{slog.String("outcome", res.outcome), slog.Duration("took", took)}
	if res.reason != "" {
		logAttrs = append(logAttrs, slog.String("reason", res.reason))
	}
	switch res.outcome {
	case "duplicate":
		c.metrics.duplicates.Add(ctx, 1, attrs)
		c.log.InfoContext(ctx, "duplicate acknowledged", logAttrs...)
	default:
		c.metrics.processed.Add(ctx, 1, metric.WithAttributes(attrConsumer.String(c.spec.Name), attrType.String(d.Type), attrOutcome.String(res.outcome)))
		c.log.InfoContext(ctx, "message "+res.outcome, logAttrs...)
	}
}

// apply runs the transaction(s) of one delivery. A transaction that loses a
// serialization failure or a deadlock is run again at once, a few times,
// before the failure counts.
func (c *consumer) apply(ctx context.Context, d *Delivery) (res result, err error) {
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
		res, external, err = c.firstStep(ctx, d)
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
			return store.MarkInboxProcessed(ctx, tx, c.spec.Name, d.MessageID, store.OutcomeApplied, "")
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
func (c *consumer) firstStep(ctx context.Context, d *Delivery) (result, *External, error) {
	var (
		res         result
		external    *External
		afterCommit func(context.Context)
	)
	err := c.inTx(ctx, func(tx pgx.Tx) error {
		decision, err := store.BeginInbox(ctx, tx, d.inboxEntry(c.spec.Name), c.cfg.ProcessingLease)
		if err != nil {
			return err
		}
		switch {
		case decision.Duplicate:
			res = result{outcome: "duplicate", reason: "already processed"}
			if decision.PayloadMismatch {
				res.reason = "already processed; this delivery's body differs (a producer reused the message_id)"
				c.metrics.payloadMismatch.Add(ctx, 1, metric.WithAttributes(attrConsumer.String(c.spec.Name)))
			}
			return nil
		case decision.Busy:
			res = result{outcome: "busy", reason: "another delivery is between the steps of its side effect"}
			return nil
		}
		c.metrics.attempt.Record(ctx, int64(decision.Attempt), metric.WithAttributes(attrConsumer.String(c.spec.Name)))

		out, err := c.spec.Handler.Handle(ctx, tx, d)
		if err != nil {
			return err
		}
		afterCommit = out.AfterCommit
		if len(out.Publish) > 0 {
			meta := store.MessageMeta{CorrelationID: d.CorrelationID, CausationID: d.MessageID, Producer: c.cfg.Producer}
			if _, err := store.EnqueueMessages(ctx, tx, meta, out.Publish...); err != nil {
				return err
			}
		}
		switch {
		case out.External != nil:
			external = out.External
			res = result{outcome: "processed"}
			return store.HoldInbox(ctx, tx, c.spec.Name, d.MessageID) // PROCESSING until the second step
		case out.Ignored != "":
			res = result{outcome: "ignored", reason: out.Ignored}
			return store.MarkInboxProcessed(ctx, tx, c.spec.Name, d.MessageID, store.OutcomeIgnored, out.Ignored)
		}
		res = result{outcome: "processed"}
		return nil // BeginInbox wrote the row PROCESSED (APPLIED): true as of the commit
	})
	if err == nil && afterCommit != nil {
		afterCommit(ctx)
	}
	return res, external, err
}

func (c *consumer) inTx(ctx context.Context, f func(pgx.Tx) error) error {
	start := time.Now()
	err := pgx.BeginFunc(ctx, c.deps.Pool, f)
	c.metrics.txDuration.Record(ctx, time.Since(start).Seconds(), metric.WithAttributes(attrConsumer.String(c.spec.Name)))
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
		sleep(ctx, time.Duration(try)*10*time.Millisecond)
	}
	return err
}

func retryableInPlace(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "40001" || pgErr.Code == "40P01")
}

// fail records a failed delivery on its inbox row and moves the message
// on: to a retry queue (transient, attempts left) or to the parking lot
// (permanent, or attempts exhausted), then acknowledges it. The inbox row
// and the broker always agree: if either step fails, the delivery is not
// acknowledged, and the broker delivers it again.
func (c *consumer) fail(ctx context.Context, pub *confirmPublisher, raw amqp.Delivery, d *Delivery, cause error, start time.Time) {
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
	status := store.InboxRetryableFailed
	switch {
	case permanent:
		status = store.InboxPermanentFailed
	case d.Attempt >= c.cfg.MaxAttempts:
		status = store.InboxPoisoned
	}
	reason := cause.Error()

	if d.MessageID != "" {
		// Remember the failure in a transaction of its own (the attempt's
		// rolled back), before the message leaves this consumer.
		recordCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := store.RecordInboxFailure(recordCtx, c.deps.Pool, d.inboxEntry(c.spec.Name), store.InboxFailure{Status: status, Code: code, Message: reason})
		cancel()
		if errors.Is(err, domain.ErrConflict) {
			// PROCESSED meanwhile (a concurrent delivery finished it).
			_ = raw.Ack(false)
			c.metrics.duplicates.Add(ctx, 1, metric.WithAttributes(attrConsumer.String(c.spec.Name), attrType.String(d.Type)))
			c.log.InfoContext(ctx, "duplicate acknowledged", slog.String("outcome", "duplicate"), slog.String("reason", "processed by another delivery"))
			return
		}
		if err != nil {
			c.requeue(ctx, raw, "cannot record the failure: "+err.Error())
			return
		}
	}

	if status == store.InboxRetryableFailed {
		c.metrics.retried.Add(ctx, 1, metric.WithAttributes(attrConsumer.String(c.spec.Name), attrCode.String(code)))
		c.retryLater(ctx, pub, raw, d, d.Attempt+1, code, reason, start)
		return
	}
	if status == store.InboxPoisoned {
		c.metrics.poisoned.Add(ctx, 1, metric.WithAttributes(attrConsumer.String(c.spec.Name)))
	} else {
		c.metrics.permanent.Add(ctx, 1, metric.WithAttributes(attrConsumer.String(c.spec.Name), attrCode.String(code)))
	}
	c.park(ctx, pub, raw, d, code, reason, start)
}

// retryLater republishes the message to the retry queue for attempt and
// acknowledges the original once the broker confirmed the copy.
func (c *consumer) retryLater(ctx context.Context, pub *confirmPublisher, raw amqp.Delivery, d *Delivery, attempt int, code, reason string, start time.Time) {
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
	c.metrics.duration.Record(ctx, time.Since(start).Seconds(), metric.WithAttributes(attrConsumer.String(c.spec.Name), attrOutcome.String("retried")))
	c.log.WarnContext(ctx, "retry scheduled", slog.String("outcome", "retried"), slog.String("reason_code", code),
		slog.String("reason", reason), slog.Int("next_attempt", attempt), slog.String("retry_queue", queue),
		slog.Duration("took", time.Since(start)))
}

// park publishes the message to the parking lot with headers that say why,
// and acknowledges the original once the broker confirmed the copy.
func (c *consumer) park(ctx context.Context, pub *confirmPublisher, raw amqp.Delivery, d *Delivery, code, reason string, start time.Time) {
	queue := QueueName(c.spec.Name)
	msg := republish(raw)
	msg.Headers[HeaderParkedCode] = code
	msg.Headers[HeaderParkedReason] = reason
	msg.Headers[HeaderParkedConsumer] = c.spec.Name
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
	c.metrics.parked.Add(ctx, 1, metric.WithAttributes(attrConsumer.String(c.spec.Name), attrCode.String(code)))
	c.metrics.duration.Record(ctx, time.Since(start).Seconds(), metric.WithAttributes(attrConsumer.String(c.spec.Name), attrOutcome.String("parked")))
	c.log.ErrorContext(ctx, "message parked", slog.String("outcome", "parked"), slog.String("reason_code", code),
		slog.String("reason", reason), slog.String("parking_lot", ParkingLotName(queue)), slog.Duration("took", time.Since(start)))
}

// requeue gives a delivery back to the broker when it could not be made
// safe elsewhere. It first waits, holding the delivery, until the database
// answers again (at most requeueWait): a database outage then costs each
// held message one redelivery per requeueWait instead of a hot loop, and
// the work queue's delivery limit (20 by default: ten minutes of outage)
// bounds the rest.
func (c *consumer) requeue(ctx context.Context, raw amqp.Delivery, why string) {
	c.log.WarnContext(ctx, "delivery requeued", slog.String("outcome", "requeued"), slog.String("reason", why))
	c.metrics.requeued.Add(ctx, 1, metric.WithAttributes(attrConsumer.String(c.spec.Name)))
	deadline := time.Now().Add(requeueWait)
	for sleep(ctx, time.Second) && time.Now().Before(deadline) {
		pingCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := c.deps.Pool.Ping(pingCtx)
		cancel()
		if err == nil {
			break
		}
	}
	_ = raw.Nack(false, true)
}

// requeueWait bounds how long requeue waits for the database.
const requeueWait = 30 * time.Second

// republish copies a delivery into a new publishing: the same message id,
// properties, headers and body.
func republish(raw amqp.Delivery) amqp.Publishing {
	headers := amqp.Table{}
	for k, v := range raw.Headers {
		// The broker's own bookkeeping of the earlier trips stays behind.
		if k != "x-death" && k != "x-delivery-count" && !strings.HasPrefix(k, "x-first-death-") {
			headers[k] = v
		}
	}
	return amqp.Publishing{
		Headers: headers, ContentType: raw.ContentType, ContentEncoding: raw.ContentEncoding,
		DeliveryMode: amqp.Persistent, Priority: raw.Priority, CorrelationId: raw.CorrelationId,
		ReplyTo: raw.ReplyTo, Expiration: raw.Expiration, MessageId: raw.MessageId, Timestamp: raw.Timestamp,
		Type: raw.Type, UserId: raw.UserId, AppId: raw.AppId, Body: raw.Body,
	}
}

// confirmPublisher publishes the consumers' retries and parkings, one at a
// time, and reports success only once the broker confirmed the message and
// did not return it. These are rare, so one at a time is plenty.
type confirmPublisher struct {
	mu      sync.Mutex
	ch      *amqp.Channel
	returns chan amqp.Return
}

func newConfirmPublisher(conn *amqp.Connection) (*confirmPublisher, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("open publisher channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		return nil, fmt.Errorf("confirm mode: %w", err)
	}
	return &confirmPublisher{ch: ch, returns: ch.NotifyReturn(make(chan amqp.Return, 1))}, nil
}

// publish sends msg to queue through the default exchange.
func (p *confirmPublisher) publish(ctx context.Context, queue string, msg amqp.Publishing) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	dc, err := p.ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, msg)
	if err != nil {
		return err
	}
	acked, err := dc.WaitContext(ctx)
	if err != nil {
		return fmt.Errorf("no confirm: %w", err)
	}
	select { // a return comes before the ack of the same message
	case ret := <-p.returns:
		return fmt.Errorf("returned: %d %s (queue %s missing?)", ret.ReplyCode, ret.ReplyText, queue)
	default:
	}
	if !acked {
		return errors.New("nacked by RabbitMQ")
	}
	return nil
}

// housekeeping deletes PROCESSED inbox rows past the retention window.
func (cs *Consumers) housekeeping(ctx context.Context) {
	if cs.cfg.InboxRetention == 0 {
		return
	}
	t := time.NewTicker(time.Minute)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for {
			n, err := store.DeleteProcessedInbox(ctx, cs.deps.Pool, cs.cfg.InboxRetention, 1000)
			if err != nil {
				if ctx.Err() == nil {
					cs.deps.Logger.WarnContext(ctx, "deleting processed inbox rows failed", slog.String("error", err.Error()))
				}
				break
			}
			if n < 1000 {
				break
			}
		}
	}
}
