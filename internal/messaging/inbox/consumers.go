package inbox

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/yourorg/orders/internal/background"
	"github.com/yourorg/orders/internal/messaging"
	"github.com/yourorg/orders/internal/messaging/outbox"
)

// Deps is what the consumers run on.
type Deps struct {
	Pool           *pgxpool.Pool
	AMQPURL        string
	Logger         *slog.Logger
	MeterProvider  metric.MeterProvider
	TracerProvider trace.TracerProvider // default: the global one
}

// Consumers runs the consumers of a process, each on its own connection,
// and the retention of the inbox rows they share.
type Consumers struct {
	cfg     Config
	deps    Deps
	loops   []*loop
	metrics *consumerMetrics
	tracer  trace.Tracer
	outbox  outbox.Writer // writes the handlers' follow-up messages

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

// loop runs one consumer: its broker sessions and its workers.
type loop struct {
	*Consumers
	def       *Consumer
	topology  Topology
	log       *slog.Logger
	consuming atomic.Bool
	held      atomic.Int64                     // deliveries held while the database is unavailable
	pub       atomic.Pointer[confirmPublisher] // the session's, for tests
}

// NewConsumers prepares the given consumers; Run starts them.
func NewConsumers(cfg Config, deps Deps, consumers ...*Consumer) (*Consumers, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("consumer config: %w", err)
	}
	cs := &Consumers{cfg: cfg, deps: deps, tracer: messaging.Tracer(deps.TracerProvider, scope), exit: os.Exit,
		outbox: outbox.Writer{Producer: cfg.Producer}}
	m, err := newConsumerMetrics(deps.MeterProvider.Meter(scope), cs)
	if err != nil {
		return nil, err
	}
	cs.metrics = m
	for _, c := range consumers {
		m.zero(c)
		cs.loops = append(cs.loops, &loop{
			Consumers: cs,
			def:       c,
			topology:  Topology{Consumer: c.name, Types: c.Types(), RetryDelays: cfg.RetryDelays, DeliveryLimit: cfg.DeliveryLimit},
			log:       deps.Logger.With(slog.String("consumer_name", c.name)),
		})
	}
	return cs, nil
}

// Ready reports whether every consumer is consuming, none holds deliveries
// for an unavailable database, and the database answers.
func (cs *Consumers) Ready(ctx context.Context) error {
	for _, c := range cs.loops {
		if !c.consuming.Load() {
			return fmt.Errorf("consumer %s is not consuming", c.def.name)
		}
		if n := c.held.Load(); n > 0 {
			return fmt.Errorf("consumer %s holds %d deliveries: the database takes no writes", c.def.name, n)
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
	for _, c := range cs.loops {
		wg.Go(func() { c.run(ctx) })
	}
	if cs.cfg.InboxRetention > 0 {
		retention := background.Retention{
			What: "processed inbox rows", Logger: cs.deps.Logger,
			Delete: func(ctx context.Context, limit int) (int64, error) {
				return DeleteProcessed(ctx, cs.deps.Pool, cs.cfg.InboxRetention, limit)
			},
		}
		wg.Go(func() { retention.Run(ctx) })
	}
	wg.Wait()
	return nil
}

func (c *loop) run(ctx context.Context) {
	c.log.InfoContext(ctx, "consumer starting", slog.String("queue", QueueName(c.def.name)),
		slog.Int("workers", c.cfg.Workers), slog.Int("prefetch", c.cfg.Prefetch))
	background.Reconnect{
		What: "broker session", Base: 500 * time.Millisecond, MaxDelay: 30 * time.Second,
		Logger: c.log, Session: c.session,
	}.Run(ctx)
	c.log.InfoContext(ctx, "consumer stopped")
}

// session is the life of one broker connection: declare the topology,
// consume with Workers goroutines, stop on shutdown or when the channel
// dies.
func (c *loop) session(ctx context.Context) error {
	conn, err := messaging.Dial(ctx, c.deps.AMQPURL, "order-consumer "+c.def.name)
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
	c.pub.Store(pub)
	tag := fmt.Sprintf("%s-%d-%d", c.def.name, os.Getpid(), time.Now().UnixNano())
	deliveries, err := ch.Consume(QueueName(c.def.name), tag, false, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("consume %s: %w", QueueName(c.def.name), err)
	}
	chClosed := ch.NotifyClose(make(chan *amqp.Error, 1))
	cancelled := ch.NotifyCancel(make(chan string, 1))
	c.consuming.Store(true)
	defer c.consuming.Store(false)
	c.log.InfoContext(ctx, "consuming", slog.String("queue", QueueName(c.def.name)))

	// workCtx bounds the processing: it ends ShutdownTimeout after ctx.
	workCtx, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	stopTimer := context.AfterFunc(ctx, func() { time.AfterFunc(c.cfg.ShutdownTimeout, cancelWork) })
	defer stopTimer()
	stopTaking := make(chan struct{})

	var wg sync.WaitGroup
	deliveriesClosed := make(chan struct{})
	var closeOnce sync.Once
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
					if !ok { // the broker cancelled the consumer, or the channel closed
						closeOnce.Do(func() { close(deliveriesClosed) })
						return
					}
					if !c.waitBefore(ctx, stopTaking, raw) {
						return // stopping: the delivery stays unacknowledged, and comes again
					}
					if c.cfg.BatchSize > 1 && len(c.def.waits) == 0 { // a consumer that waits takes one at a time: each waits its own time
						c.handleBatch(workCtx, pub, c.collect([]amqp.Delivery{raw}, deliveries, stopTaking))
					} else {
						c.handle(workCtx, pub, raw)
					}
				}
			}
		})
	}

	// The session ends on shutdown, when the channel dies, or when the
	// broker cancels the consumer (its queue deleted and declared again, a
	// quorum leader moved): then the next session declares the topology
	// again and consumes anew. Until it does, the consumer is not ready.
	var sessionErr error
	select {
	case <-ctx.Done():
		_ = ch.Cancel(tag, false) // no more deliveries
	case amqpErr := <-chClosed:
		sessionErr = fmt.Errorf("channel closed: %w", amqpErr)
	case <-cancelled:
		sessionErr = fmt.Errorf("the broker cancelled the consumer of %s", QueueName(c.def.name))
	case <-deliveriesClosed:
		sessionErr = fmt.Errorf("the deliveries of %s stopped", QueueName(c.def.name))
	}
	c.consuming.Store(false)
	close(stopTaking)
	wg.Wait()
	return sessionErr
}

// waitBefore waits, before a delivery is processed, as long as the
// consumer's Wait asks for its type (none for most), outside any
// transaction. It returns false when the session stops meanwhile.
func (c *loop) waitBefore(ctx context.Context, stop <-chan struct{}, raw amqp.Delivery) bool {
	wait := c.def.waits[raw.Type]
	if wait <= 0 {
		return true
	}
	c.log.InfoContext(ctx, "waiting before processing", slog.String("message_id", raw.MessageId),
		slog.String("message_type", raw.Type), slog.Duration("wait", wait))
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-stop:
		return false
	}
}
