package inbox

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/trace"

	"github.com/yourorg/orders/internal/background"
	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/messaging"
	"github.com/yourorg/orders/internal/messaging/inbox/internal/resend"
)

// Consumers runs the consumers of a process, each subscribed to its own
// queue on a connection of its own, and the retention of the inbox rows
// they share.
type Consumers struct {
	cfg           Config
	pool          *pgxpool.Pool
	log           *slog.Logger
	subscriptions []*subscription
	// horizon is where the inbox's last time partition ends (Unix seconds;
	// 0: not known yet), heldPartitions how many past retention wait for
	// their rows (timepartition.go).
	horizon, heldPartitions atomic.Int64
}

// subscription runs one consumer on its queue: a broker session at a time
// (reconnecting when one ends), each with Workers workers.
type subscription struct {
	consumer *Consumer
	topology Topology
	others   []Topology // of Config.AlsoDeclare: declared, not consumed
	cfg      Config
	pool     *pgxpool.Pool
	amqpURL  string
	log      *slog.Logger
	tracer   trace.Tracer
	metrics  *consumerMetrics

	consuming atomic.Bool
	held      atomic.Int64                     // deliveries held while the database is unavailable
	pub       atomic.Pointer[resend.Publisher] // the session's, for tests
}

// NewConsumers prepares the given consumers; Run starts them.
func NewConsumers(cfg Config, deps messaging.Deps, consumers ...*Consumer) (*Consumers, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("consumer config: %w", err)
	}
	cs := &Consumers{cfg: cfg, pool: deps.Pool, log: deps.Logger}
	m, err := newConsumerMetrics(deps.MeterProvider.Meter(scope), cs)
	if err != nil {
		return nil, err
	}
	tracer := messaging.Tracer(deps.TracerProvider, scope)
	var others []Topology
	for _, c := range cfg.AlsoDeclare {
		others = append(others, cfg.topology(c))
	}
	for _, c := range consumers {
		m.zero(c)
		cs.subscriptions = append(cs.subscriptions, &subscription{
			consumer: c,
			topology: cfg.topology(c),
			others:   others,
			cfg:      cfg,
			pool:     deps.Pool,
			amqpURL:  deps.AMQPURL,
			log:      deps.Logger.With(slog.String("consumer_name", c.name)),
			tracer:   tracer,
			metrics:  m,
		})
	}
	return cs, nil
}

// Ready reports whether every consumer is consuming, none holds deliveries
// for an unavailable database, and the database answers.
func (cs *Consumers) Ready(ctx context.Context) error {
	for _, s := range cs.subscriptions {
		if !s.consuming.Load() {
			return fmt.Errorf("consumer %s is not consuming", s.consumer.name)
		}
		if n := s.held.Load(); n > 0 {
			return fmt.Errorf("consumer %s holds %d deliveries: the database takes no writes", s.consumer.name, n)
		}
	}
	return database.Ping(ctx, cs.pool)
}

// Run consumes until ctx ends. Then each consumer stops taking deliveries,
// finishes those in progress (for at most ShutdownTimeout) and leaves the
// rest unacknowledged, for the broker to deliver again.
func (cs *Consumers) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	for _, s := range cs.subscriptions {
		wg.Go(func() { s.run(ctx) })
	}
	wg.Go(func() { cs.maintainTimePartitions(ctx) })
	wg.Wait()
	return nil
}

func (s *subscription) run(ctx context.Context) {
	s.log.InfoContext(ctx, "consumer starting", slog.String("queue", s.topology.Queue()),
		slog.Int("workers", s.cfg.Workers), slog.Int("prefetch", s.cfg.Prefetch), slog.Int("partitions", s.cfg.Partitions))
	background.Reconnect{
		What: "broker session", Base: 500 * time.Millisecond, MaxDelay: 30 * time.Second,
		Logger: s.log, Session: s.session,
	}.Run(ctx)
	s.log.InfoContext(ctx, "consumer stopped")
}

// session is the life of one broker connection: declare the topology,
// consume with Workers workers, stop on shutdown or when the channel dies.
func (s *subscription) session(ctx context.Context) error {
	conn, ch, err := messaging.Open(ctx, s.amqpURL, "order-consumer "+s.consumer.name)
	if err != nil {
		return err
	}
	defer func() { _ = conn.CloseDeadline(time.Now().Add(time.Second)) }()
	for _, t := range append([]Topology{s.topology}, s.others...) {
		if err := t.Declare(ch); err != nil {
			return err
		}
	}
	if err := ch.Qos(s.cfg.Prefetch, 0, false); err != nil {
		return fmt.Errorf("set prefetch: %w", err)
	}
	pub, err := resend.NewPublisher(conn)
	if err != nil {
		return err
	}
	s.pub.Store(pub)

	// The work queues: one, taken by Workers workers; or, with partitions,
	// one per partition, each taken by a worker of its own, in order.
	type feed struct {
		queue, tag string
		deliveries <-chan amqp.Delivery
		workers    int
	}
	var feeds []feed
	for _, queue := range s.cfg.topology(s.consumer).WorkQueues() {
		tag := fmt.Sprintf("%s-%d-%d", queue, os.Getpid(), time.Now().UnixNano())
		deliveries, err := ch.Consume(queue, tag, false, false, false, false, nil)
		if err != nil {
			return fmt.Errorf("consume %s: %w", queue, err)
		}
		workers := s.cfg.Workers
		if s.cfg.Partitions > 0 {
			workers = 1
		}
		feeds = append(feeds, feed{queue: queue, tag: tag, deliveries: deliveries, workers: workers})
	}
	chClosed := ch.NotifyClose(make(chan *amqp.Error, 1))
	cancelled := ch.NotifyCancel(make(chan string, len(feeds)))
	s.consuming.Store(true)
	defer s.consuming.Store(false)
	s.log.InfoContext(ctx, "consuming", slog.Int("queues", len(feeds)), slog.String("queue", feeds[0].queue))

	// workCtx bounds the processing: it ends ShutdownTimeout after ctx.
	workCtx, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	stopTimer := context.AfterFunc(ctx, func() { time.AfterFunc(s.cfg.ShutdownTimeout, cancelWork) })
	defer stopTimer()
	stopTaking := make(chan struct{})

	var wg sync.WaitGroup
	deliveriesClosed := make(chan struct{})
	var closeOnce sync.Once
	for _, f := range feeds {
		for range f.workers {
			w := &worker{consumer: s.consumer, cfg: s.cfg, pool: s.pool, pub: pub, topology: s.topology,
				log: s.log, tracer: s.tracer, metrics: s.metrics, held: &s.held, queue: f.queue, ordering: orderingOf(s.cfg),
				stop: stopTaking}
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
					case raw, ok := <-f.deliveries:
						if !ok { // the broker cancelled the consumer, or the channel closed
							closeOnce.Do(func() { close(deliveriesClosed) })
							return
						}
						if !s.waitBefore(ctx, stopTaking, raw) {
							return // stopping: the delivery stays unacknowledged, and comes again
						}
						batch := []amqp.Delivery{raw}
						if len(s.consumer.waits) == 0 { // a consumer that waits takes one at a time: each waits its own time
							batch = s.collect(batch, f.deliveries, stopTaking)
						}
						w.handle(workCtx, batch)
					}
				}
			})
		}
	}

	// The session ends on shutdown, when the channel dies, or when the
	// broker cancels a consumer (its queue deleted and declared again, a
	// quorum leader moved): then the next session declares the topology
	// again and consumes anew. Until it does, the consumer is not ready.
	var sessionErr error
	select {
	case <-ctx.Done():
		// No more deliveries. A partition's consumer is not cancelled but
		// closed with its channel once its worker is done (below), so that
		// the broker takes back what it holds in the same step as it passes
		// the partition to the next replica: those come first, in order.
		if s.cfg.Partitions == 0 {
			for _, f := range feeds {
				_ = ch.Cancel(f.tag, false)
			}
		}
	case amqpErr := <-chClosed:
		sessionErr = fmt.Errorf("channel closed: %w", amqpErr)
	case tag := <-cancelled:
		sessionErr = fmt.Errorf("the broker cancelled the consumer %s", tag)
	case <-deliveriesClosed:
		sessionErr = fmt.Errorf("the deliveries of %s stopped", s.consumer.name)
	}
	s.consuming.Store(false)
	close(stopTaking)
	if sessionErr != nil {
		// The channel is gone: what the workers hold can be neither acked
		// nor given back, and the broker redelivers it. Their handlers stop
		// now (their transactions roll back) rather than keep this
		// consumer's every queue waiting for the slowest of them.
		cancelWork()
	}
	wg.Wait()
	return sessionErr
}

// waitBefore waits, before a delivery is processed, as long as the
// consumer's Wait asks for its type (none for most), outside any
// transaction. It returns false when the session stops meanwhile.
func (s *subscription) waitBefore(ctx context.Context, stop <-chan struct{}, raw amqp.Delivery) bool {
	wait := s.consumer.waits[raw.Type]
	if wait <= 0 {
		return true
	}
	s.log.InfoContext(ctx, "waiting before processing", slog.String("message_id", raw.MessageId),
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

// collect adds to batch the deliveries that are already waiting, up to
// BatchSize, and, with BatchWait set, those that arrive within BatchWait.
// It never waits for a first one, so a quiet queue gets no added latency.
// The client hands deliveries over one at a time from a goroutine of its
// own, so "already waiting" means: there after that goroutine has had a
// chance to run (a few yields).
func (s *subscription) collect(batch []amqp.Delivery, deliveries <-chan amqp.Delivery, stop <-chan struct{}) []amqp.Delivery {
	var wait <-chan time.Time
	if s.cfg.BatchWait > 0 {
		t := time.NewTimer(s.cfg.BatchWait)
		defer t.Stop()
		wait = t.C
	}
	for misses := 0; len(batch) < s.cfg.BatchSize; {
		select {
		case raw, ok := <-deliveries:
			if !ok {
				return batch
			}
			batch, misses = append(batch, raw), 0
			continue
		default:
		}
		if wait == nil {
			if misses++; misses > 3 {
				return batch
			}
			runtime.Gosched()
			continue
		}
		select {
		case raw, ok := <-deliveries:
			if !ok {
				return batch
			}
			batch = append(batch, raw)
		case <-wait:
			return batch
		case <-stop:
			return batch
		}
	}
	return batch
}

// Declare declares the queues and bindings of consumers (and the exchange)
// once, and returns: for a deployment step that must create the whole
// topology before any relay publishes (order-consumer declare).
func Declare(ctx context.Context, amqpURL string, cfg Config, consumers ...*Consumer) error {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("consumer config: %w", err)
	}
	conn, ch, err := messaging.Open(ctx, amqpURL, "declare topology")
	if err != nil {
		return err
	}
	defer func() { _ = conn.CloseDeadline(time.Now().Add(time.Second)) }()
	for _, c := range consumers {
		if err := cfg.topology(c).Declare(ch); err != nil {
			return err
		}
	}
	return nil
}
