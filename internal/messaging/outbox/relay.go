package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"github.com/yourorg/orders/internal/background"
	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/messaging"
	"github.com/yourorg/orders/internal/messaging/outbox/internal/pipeline"
)

// Relay publishes committed outbox rows. Run several at once if you like:
// claims never overlap (SKIP LOCKED) and a dead relay's rows come back
// when its lease ends.
type Relay struct {
	cfg     Config
	pool    *pgxpool.Pool
	log     *slog.Logger
	metrics *relayMetrics
	tracer  trace.Tracer
	pipe    *pipeline.Pipeline // publishing and recording (internal/pipeline)

	wake      chan struct{} // a rows-may-be-due signal; holds at most one
	wakeups   wakeups       // what decides whether a NOTIFY wakes it (listen.go)
	connected atomic.Bool   // a confirm channel is open
	// readers is the last look at the readers' queues (Config.Readers).
	readers atomic.Pointer[readerCheck]
	// partitions are those this relay holds (Config.Partitions); nil: none.
	partitions    atomic.Pointer[[]int32]
	partitionRows atomic.Bool // the lease rows are made
	// everyPartition, set by ClaimEveryPartition: claim every partition's
	// rows, leasing none.
	everyPartition bool
	// crashed ends when Config.Faults stands in for a crash: Run stops at
	// once and returns its cause, and nothing more is marked.
	crashed context.Context
	crash   context.CancelCauseFunc
	// sweepCutoff, set by ClaimOnlyBefore, says up to when the rows are
	// this relay's to claim; false: claim nothing.
	sweepCutoff func() (time.Time, bool)
	// horizon is where the last time partition ends (Unix seconds; 0: not
	// known yet), heldPartitions how many past retention wait for their
	// rows (timepartition.go).
	horizon, heldPartitions atomic.Int64
	// uncertain are the tokens of the claims of unknown outcome, kept
	// across sessions: a claim whose answer was lost may have taken rows
	// all the same (claimLoop), a mark a failover lost leaves them
	// PUBLISHING (claimsMarked).
	uncertain struct {
		sync.Mutex
		tokens []string
	}
	// marked are the claims marked within the last lease, and failedAt
	// when the relay last saw its database fail: a mark commits
	// asynchronously, and a primary that dies may take it along
	// (claimsMarked).
	marked struct {
		sync.Mutex
		claims   []markedClaim
		failedAt time.Time
	}
	// rescan, set at every poll tick, has the next claim scan from the
	// start (claimLoop's floor).
	rescan atomic.Bool
	// recovered is when the last recovery of expired leases began (zero:
	// none, or it failed), recoveredFull the last that looked at every
	// lease (recoverExpired); maintain's alone.
	recovered, recoveredFull time.Time
}

// NewRelay returns a relay; Run starts it.
func NewRelay(cfg Config, deps messaging.Deps) (*Relay, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("relay config: %w", err)
	}
	r := &Relay{
		cfg:    cfg,
		pool:   deps.Pool,
		log:    deps.Logger.With(slog.String("relay_id", cfg.ID)),
		wake:   make(chan struct{}, 1),
		tracer: messaging.Tracer(deps.TracerProvider, scope),
	}
	r.crashed, r.crash = context.WithCancelCause(context.Background())
	r.resetWakeups()
	meter := deps.MeterProvider.Meter(scope)
	pipe, err := pipeline.New(pipeline.Settings{
		MaxInFlight: cfg.MaxInFlight, ConfirmTimeout: cfg.ConfirmTimeout, PollInterval: cfg.PollInterval,
		BackoffBase: cfg.BackoffBase, BackoffMax: cfg.BackoffMax, MaxAttempts: cfg.MaxAttempts, DBTimeout: cfg.DBTimeout, Lease: cfg.Lease,
		MessageTypes: cfg.MessageTypes, Faults: cfg.Faults,
	}, pipeline.Deps{
		AMQPURL: deps.AMQPURL, Pool: deps.Pool, Logger: r.log, Tracer: r.tracer, Meter: meter,
		Wake: r.signal, Crash: r.crash,
	})
	if err != nil {
		return nil, err
	}
	r.pipe = pipe
	if len(cfg.Readers) > 0 {
		r.readers.Store(uncheckedReaders(readerQueues(cfg.Readers, false)))
	}
	m, err := newRelayMetrics(meter, r)
	if err != nil {
		return nil, err
	}
	r.metrics = m
	return r, nil
}

// ID is the relay's claimer id.
func (r *Relay) ID() string { return r.cfg.ID }

// Config is the relay's configuration, defaults applied.
func (r *Relay) Config() Config { return r.cfg }

// Pipeline is the relay's publishing and recording, for a relay of another
// row source that shares them (the log-tailing relay's stream).
func (r *Relay) Pipeline() *pipeline.Pipeline { return r.pipe }

// Holds reports whether the relay holds messages of messageType back: a
// queue of one of its readers is missing (Config.Readers).
func (r *Relay) Holds(messageType string) bool {
	return slices.Contains(r.readers.Load().held(), messageType)
}

// ClaimOnlyBefore restricts the relay to rows written before the time
// cutoff returns, and rows whose last publish failed; while cutoff returns
// false, it claims nothing. The log-tailing relay (package wal) runs its
// sweep so, the newer rows being its stream's. Call it before Run.
func (r *Relay) ClaimOnlyBefore(cutoff func() (time.Time, bool)) { r.sweepCutoff = cutoff }

// ClaimEveryPartition has a relay with Config.Partitions claim the rows of
// every partition, leasing none, each message still carrying its
// partition. For a relay that claims alone: the log-tailing relay's sweep,
// which claims only while its relay streams the slot (a standby's sweep,
// leasing a share, would leave that share unswept). Two such relays at once
// (a slot changing hands) are safe: the claim holds an aggregate's later
// rows behind an earlier one however many relays claim. Call it before Run.
func (r *Relay) ClaimEveryPartition() { r.everyPartition = true }

// Ready reports whether the relay can publish: it holds an open confirm
// channel, every reader's queue is there (Config.Readers), and the
// database answers.
func (r *Relay) Ready(ctx context.Context) error {
	if !r.connected.Load() {
		return errors.New("not connected to RabbitMQ")
	}
	if err := r.readers.Load().notReady(); err != nil {
		return err
	}
	return database.Ping(ctx, r.pool)
}

// Run publishes until ctx ends, then stops claiming, waits up to
// ShutdownTimeout for the confirms of what it published, marks those rows,
// and hands the rest back. Lost broker connections are re-established with
// backoff; nothing claimed is lost meanwhile (its rows are handed back, or
// recovered when their lease ends).
//
// Its goroutines: listen (LISTEN/NOTIFY wakes the claim loop), maintain
// (the poll tick, lease recovery, time partitions and retention), and one session per broker
// connection (session.go), which runs the publishing pipeline.
func (r *Relay) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx) // ends the helpers below when Run returns
	defer cancel()
	defer context.AfterFunc(r.crashed, cancel)()
	if !r.cfg.NotifyOff {
		wg.Go(func() { r.listen(ctx) })
	}
	wg.Go(func() { r.maintain(ctx) })

	r.log.InfoContext(ctx, "relay starting", slog.Int("batch_size", r.cfg.BatchSize),
		slog.Int("max_in_flight", r.cfg.MaxInFlight), slog.Bool("notify", !r.cfg.NotifyOff))
	background.Reconnect{
		What: "broker session", Base: 500 * time.Millisecond, MaxDelay: 30 * time.Second, Logger: r.log,
		Session: func(ctx context.Context) error { return newSession(r).run(ctx) },
	}.Run(ctx)
	if err := context.Cause(r.crashed); err != nil {
		return err
	}
	r.log.InfoContext(ctx, "relay stopped")
	return nil
}

// signal wakes the claim loop; a signal already pending absorbs this one.
func (r *Relay) signal() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// maintain runs the relay's clock: the poll tick (a wake-up in case a
// NOTIFY was missed or a retry came due), the partition leases, lease
// recovery, and the time partitions (made ahead, and dropped by retention).
// When it stops, it gives the partitions back.
func (r *Relay) maintain(ctx context.Context) {
	go r.maintainTimePartitions(ctx)
	r.leasePartitions(ctx)
	defer r.releasePartitions(ctx)
	poll := time.NewTicker(r.cfg.PollInterval)
	defer poll.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-poll.C:
			r.leasePartitions(ctx)
			r.rescan.Store(true)
			r.signal()
			r.recoverExpired(ctx)
		}
	}
}

// recoverExpired hands back the rows of relays whose lease ran out, and
// names them: a message whose publish keeps outliving its relay (one that
// crashes relays) shows up here, again and again.
func (r *Relay) recoverExpired(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.DBTimeout)
	defer cancel()
	// A lease that ran out before the last recovery was recovered by it,
	// or belongs to a claim that was not visible to it, which committed
	// after it and so began at most DBTimeout before it: the leases that
	// ran out since then, and DBTimeout and a margin before, are enough.
	// Once a minute, and after a failure, every lease that ever ran out.
	began := time.Now()
	var window time.Duration
	if !r.recovered.IsZero() && began.Sub(r.recoveredFull) < time.Minute {
		window = began.Sub(r.recovered) + r.cfg.DBTimeout + 5*time.Second
	}
	ids, err := recoverExpiredClaims(ctx, r.pool, window)
	if err == nil {
		r.recovered = began
		if window == 0 {
			r.recoveredFull = began
		}
	} else {
		r.recovered = time.Time{}
	}
	if err != nil && ctx.Err() == nil {
		r.log.WarnContext(ctx, "recovering expired claims failed", slog.String("error", err.Error()))
	}
	if len(ids) > 0 {
		r.metrics.recovered.Add(ctx, int64(len(ids)))
		names := make([]string, 0, min(len(ids), 10))
		for _, id := range ids[:min(len(ids), 10)] {
			names = append(names, id.String())
		}
		r.log.WarnContext(ctx, "recovered outbox rows whose relay lease expired", slog.Int("rows", len(ids)),
			slog.Any("message_ids", names))
	}
}
