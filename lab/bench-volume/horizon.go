package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/messaging"
	"github.com/yourorg/orders/internal/messaging/outbox"
	"github.com/yourorg/orders/internal/messaging/outbox/wal"
	"github.com/yourorg/orders/internal/messaging/tablestats"
	"github.com/yourorg/orders/internal/store"
	"github.com/yourorg/orders/lab/sandbox"
)

// The held-horizon run (-horizon): how fast each relay drains a backlog
// while a session idle in transaction has held the database's xmin
// horizon for a while under a steady load, against the same relay's rate
// before the hold. Each relay mode has a database of its own (on a server
// with wal_level=logical when the log-tailing relay is measured: the
// shared one if it is, else one of this command's own), a relay with the
// service's defaults, and a steady load of -horizon-rate rows/s written
// through the outbox's Writer, one row per transaction, as order-api
// writes them. The relays publish to a vhost of their own.
//
// The phases, for every mode at once, the drains of one mode after
// another's so that they do not compete (after a drain not counted and a
// VACUUM (ANALYZE), so that the claim is planned on statistics):
//
//  1. -horizon-drains drains each, unpinned: -horizon-backlog rows
//     written at once (transactions of 100), timed from the first write to
//     the last row's delivery;
//  2. the hold: in each database a session runs BEGIN ISOLATION LEVEL
//     REPEATABLE READ; SELECT 1; and stays idle in transaction for
//     -horizon, under the steady load: every version the relay's updates
//     leave behind stays, as does every index entry;
//  3. as many drains each, still pinned; then the pin ends.
//
// The ratio is the median pinned rate over the median unpinned one
// (the targets: 0.75 for the polling relay, 0.95 for the log-tailing
// one). The relays publish to classic queues, which cost the broker less
// than quorum queues, so the database's share of a row shows more.

// Routing keys: the steady load's rows go to a queue that keeps only the
// newest thousand messages, the backlog's to a queue the run consumes to
// see each drain end.
const (
	horizonExchange = "bench_horizon"
	steadyType      = "bench.steady"
	backlogType     = "bench.backlog"
	backlogTx       = 100 // rows per transaction of a backlog
)

// horizonTargets are the least pinned/unpinned ratio wanted per mode.
var horizonTargets = map[string]float64{"poll": 0.75, "wal": 0.95}

// benchMessage is what the run writes to the outbox.
type benchMessage struct {
	Type string `json:"-"`
	ID   string `json:"id"`
	Seq  int    `json:"seq"`
}

func (m benchMessage) MessageType() string { return m.Type }
func (benchMessage) MessageVersion() int   { return 1 }
func (m benchMessage) AggregateID() string { return m.ID }

var horizonWriter = outbox.Writer{Producer: "bench-horizon", Exchange: horizonExchange, AggregateType: "bench"}

// parseModes reads -horizon-modes: poll, wal, or both, comma-separated.
func parseModes(s string) ([]string, error) {
	var modes []string
	for m := range strings.SplitSeq(s, ",") {
		m = strings.TrimSpace(m)
		if _, ok := horizonTargets[m]; !ok {
			return nil, fmt.Errorf("-horizon-modes: %q is not poll or wal", m)
		}
		if !slices.Contains(modes, m) {
			modes = append(modes, m)
		}
	}
	return modes, nil
}

// rowsPerSecond is n rows over d; 0 when d is not positive.
func rowsPerSecond(n int, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}

// dueRows is how many rows a steady load of rate rows/s owes after
// elapsed, having written written.
func dueRows(rate int, elapsed time.Duration, written int) int {
	return max(0, int(float64(rate)*elapsed.Seconds())-written)
}

// medianRate is the middle of rates (the mean of the two middle ones).
func medianRate(rates []float64) float64 {
	if len(rates) == 0 {
		return 0
	}
	s := slices.Clone(rates)
	slices.Sort(s)
	if n := len(s); n%2 == 0 {
		return (s[n/2-1] + s[n/2]) / 2
	}
	return s[len(s)/2]
}

// runHorizon is the held-horizon run.
func runHorizon(ctx context.Context, cfg config, stdout io.Writer) error {
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	out := func(format string, a ...any) { _, _ = fmt.Fprintf(stdout, format, a...) }

	// Server: the log-tailing relay needs wal_level=logical.
	serverURL := cfg.databaseURL
	if slices.Contains(cfg.modes, "wal") {
		level, err := walLevel(ctx, serverURL)
		if err != nil {
			return err
		}
		if level != "logical" {
			out("the server of -database-url has wal_level=%s: starting one of this run's own with wal_level=logical\n", level)
			pg, err := sandbox.StartPostgres(ctx)
			if err != nil {
				return fmt.Errorf("start PostgreSQL with wal_level=logical: %w", err)
			}
			defer func() { _ = pg.Stop() }()
			serverURL = pg.URL
		}
	}

	// Broker: a vhost of the run's own.
	admin, err := sandbox.NewVhostAdmin(ctx, cfg.amqpURL, "")
	if err != nil {
		return err
	}
	vhost := sandbox.UniqueName("bench_horizon_")
	if err := admin.Add(ctx, vhost); err != nil {
		return fmt.Errorf("create vhost: %w", err)
	}
	defer func() { _ = admin.Remove(context.WithoutCancel(ctx), vhost) }()
	amqpURL, err := sandbox.WithPath(cfg.amqpURL, vhost)
	if err != nil {
		return err
	}

	// A database, a relay, a consumer of the backlog and a steady load per
	// mode. Every relay is up, and every slot made, before any pin: making
	// a logical slot waits for every open transaction of the server.
	var benches []*horizonBench
	defer func() {
		for _, b := range benches {
			b.close(context.WithoutCancel(ctx), serverURL)
		}
	}()
	for _, mode := range cfg.modes {
		b, err := startHorizonBench(ctx, serverURL, amqpURL, mode, cfg.horizonRate, logger)
		if b != nil {
			benches = append(benches, b)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", mode, err)
		}
	}
	out("relays %s up, %d rows/s of steady load each; warming up for 10s\n", strings.Join(cfg.modes, ", "), cfg.horizonRate)
	if err := sleep(ctx, 10*time.Second); err != nil {
		return err
	}
	// A new database has no statistics until autovacuum analyzes it, a
	// minute or more on: the claim's plan is a poor one until then, and
	// the first drains would be the slowest of the run. A drain not
	// counted, then VACUUM (ANALYZE): the table as a running service's.
	out("a drain each not counted, then VACUUM (ANALYZE) message_outbox\n")
	for _, b := range benches {
		if _, err := b.drain(ctx, cfg.horizonBacklog); err != nil {
			return fmt.Errorf("%s: warm-up drain: %w", b.mode, err)
		}
		if _, err := b.pool.Exec(ctx, "VACUUM (ANALYZE) message_outbox"); err != nil {
			return fmt.Errorf("%s: %w", b.mode, err)
		}
	}

	drains := func(phase string) error {
		for _, b := range benches {
			for i := range cfg.horizonDrains {
				rate, err := b.drain(ctx, cfg.horizonBacklog)
				if err != nil {
					return fmt.Errorf("%s: drain %d %s: %w", b.mode, i+1, phase, err)
				}
				b.rates[phase] = append(b.rates[phase], rate)
				out("  %-4s %-8s drain %d: %d rows at %.0f rows/s\n", b.mode, phase, i+1, cfg.horizonBacklog, rate)
			}
		}
		return nil
	}
	out("\n%d drains of %d rows per mode, unpinned\n", cfg.horizonDrains, cfg.horizonBacklog)
	if err := drains("unpinned"); err != nil {
		return err
	}

	// The hold: a session idle in transaction in every database.
	out("\nholding each database's xmin horizon for %s (a session idle in transaction, REPEATABLE READ)\n", cfg.horizon)
	for _, b := range benches {
		if err := b.pin(ctx); err != nil {
			return fmt.Errorf("%s: pin: %w", b.mode, err)
		}
	}
	began := time.Now()
	every := min(time.Minute, max(cfg.horizon/5, time.Second))
	for left := cfg.horizon; left > 0; left -= every {
		if err := sleep(ctx, min(every, left)); err != nil {
			return err
		}
		for _, b := range benches {
			st, err := b.stats(ctx)
			if err != nil {
				return fmt.Errorf("%s: %w", b.mode, err)
			}
			out("  %-4s %6s: %d dead tuples in message_outbox, horizon held %s, %d steady rows written\n",
				b.mode, time.Since(began).Round(time.Second), st.dead, st.held.Round(time.Second), b.written())
		}
	}
	out("\n%d drains of %d rows per mode, pinned\n", cfg.horizonDrains, cfg.horizonBacklog)
	if err := drains("pinned"); err != nil {
		return err
	}
	final := make([]horizonStats, len(benches))
	for i, b := range benches {
		if final[i], err = b.stats(ctx); err != nil {
			return fmt.Errorf("%s: %w", b.mode, err)
		}
		b.unpin(ctx)
	}

	out("\n%-4s %18s %18s %7s %7s %12s %12s\n", "mode", "unpinned (rows/s)", "pinned (rows/s)", "ratio", "target", "dead tuples", "held")
	for i, b := range benches {
		u, p := medianRate(b.rates["unpinned"]), medianRate(b.rates["pinned"])
		r := 0.0
		if u > 0 {
			r = p / u
		}
		out("%-4s %18.0f %18.0f %7.2f %7.2f %12d %12s\n", b.mode, u, p, r, horizonTargets[b.mode], final[i].dead, final[i].held.Round(time.Second))
	}
	return nil
}

func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// walLevel is the wal_level of the server of url.
func walLevel(ctx context.Context, url string) (string, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return "", err
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	var level string
	err = conn.QueryRow(ctx, "SHOW wal_level").Scan(&level)
	return level, err
}

// horizonBench is one relay mode's database, relay, steady load and
// backlog consumer.
type horizonBench struct {
	mode   string
	dbName string
	dbURL  string
	pool   *pgxpool.Pool // the load's, the backlogs' and the figures'
	relay  *pgxpool.Pool // the relay's own, as in production
	amqp   *amqp.Connection
	got    <-chan amqp.Delivery // the backlog queue's
	rates  map[string][]float64 // rows/s by phase

	stop   context.CancelFunc // stops the relay and the load
	done   sync.WaitGroup
	mu     sync.Mutex
	steady int   // rows the load wrote
	err    error // why the relay or the load stopped

	pinConn *pgx.Conn
	pinTx   pgx.Tx
}

// startHorizonBench makes mode's database (migrated as the service's),
// declares the exchange and queues, and starts the relay, the load and
// the backlog's consumer. On an error, what it returns (if not nil) holds
// what was made, for close.
func startHorizonBench(ctx context.Context, serverURL, amqpURL, mode string, rate int, logger *slog.Logger) (*horizonBench, error) {
	b := &horizonBench{mode: mode, dbName: sandbox.UniqueName("horizon_" + mode + "_"), rates: map[string][]float64{}}
	var err error
	if b.dbURL, err = sandbox.WithPath(serverURL, b.dbName); err != nil {
		return nil, err
	}
	if err := createDatabase(ctx, serverURL, b.dbName); err != nil {
		return nil, err
	}
	if b.pool, err = database.NewPool(ctx, database.PoolConfig{URL: b.dbURL, MaxConns: 4, AppName: "bench-horizon"}); err != nil {
		return b, err
	}
	m, err := store.NewMigrator(b.pool, logger)
	if err != nil {
		return b, err
	}
	err = m.Up(ctx)
	_ = m.Close()
	if err != nil {
		return b, fmt.Errorf("migrate: %w", err)
	}

	// Broker: the exchange, a queue per routing key.
	if b.amqp, err = amqp.Dial(amqpURL); err != nil {
		return b, err
	}
	ch, err := b.amqp.Channel()
	if err != nil {
		return b, err
	}
	exchange := horizonExchange
	steadyQ, backlogQ := mode+".steady", mode+".backlog"
	err = errors.Join(
		messaging.DeclareExchange(ch, exchange),
		declareBound(ch, steadyQ, steadyType+"."+mode, amqp.Table{"x-max-length": 1000, "x-overflow": "drop-head"}),
		declareBound(ch, backlogQ, backlogType+"."+mode, nil),
	)
	if err != nil {
		return b, err
	}
	if b.got, err = ch.Consume(backlogQ, "", true, false, false, false, nil); err != nil {
		return b, err
	}

	// The relay, with the service's defaults, and its readiness.
	if b.relay, err = database.NewPool(ctx, database.PoolConfig{URL: b.dbURL, AppName: "bench-horizon-relay", AsyncCommit: true}); err != nil {
		return b, err
	}
	deps := messaging.Deps{Pool: b.relay, AMQPURL: amqpURL, Logger: logger, MeterProvider: noop.NewMeterProvider()}
	rcfg := outbox.Config{ID: "bench-horizon-" + mode}
	var relay interface {
		Run(ctx context.Context) error
		Ready(ctx context.Context) error
	}
	if mode == "wal" {
		relay, err = wal.NewRelay(rcfg, wal.Config{Slot: b.dbName}, deps)
	} else {
		relay, err = outbox.NewRelay(rcfg, deps)
	}
	if err != nil {
		return b, err
	}
	runCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	b.stop = stop
	b.done.Add(2)
	go func() {
		defer b.done.Done()
		if err := relay.Run(runCtx); err != nil && runCtx.Err() == nil {
			b.fail(fmt.Errorf("relay: %w", err))
		}
	}()
	go func() {
		defer b.done.Done()
		if err := b.load(runCtx, rate); err != nil {
			b.fail(fmt.Errorf("steady load: %w", err))
		}
	}()
	deadline := time.Now().Add(time.Minute)
	for relay.Ready(ctx) != nil || !b.slotReady(ctx) {
		if time.Now().After(deadline) {
			return b, fmt.Errorf("the relay not ready within a minute: %w", relay.Ready(ctx))
		}
		if err := sleep(ctx, 200*time.Millisecond); err != nil {
			return b, err
		}
	}
	return b, nil
}

// slotReady: the log-tailing relay's slot exists (always, for polling).
func (b *horizonBench) slotReady(ctx context.Context) bool {
	if b.mode != "wal" {
		return true
	}
	var n int
	err := b.pool.QueryRow(ctx, "SELECT count(*) FROM pg_replication_slots WHERE database = current_database() AND active").Scan(&n)
	return err == nil && n > 0
}

func declareBound(ch *amqp.Channel, queue, key string, args amqp.Table) error {
	if _, err := ch.QueueDeclare(queue, false, false, false, false, args); err != nil {
		return err
	}
	return ch.QueueBind(queue, key, horizonExchange, false, nil)
}

// load writes rate rows/s, one per transaction, each as soon as it is due
// (checked every 10 ms), until ctx ends.
func (b *horizonBench) load(ctx context.Context, rate int) error {
	began := time.Now()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		for range dueRows(rate, time.Since(began), b.written()) {
			msg := benchMessage{Type: steadyType + "." + b.mode, ID: uuid.NewString()}
			err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
				_, err := horizonWriter.Write(ctx, tx, messaging.Cause{}, msg)
				return err
			})
			if ctx.Err() != nil {
				return nil
			}
			if err != nil {
				return err
			}
			b.mu.Lock()
			b.steady++
			b.mu.Unlock()
		}
	}
}

func (b *horizonBench) fail(err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.err = errors.Join(b.err, err)
}

func (b *horizonBench) failed() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.err
}

func (b *horizonBench) written() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.steady
}

// drain writes n backlog rows at once, in transactions of backlogTx, and
// returns n over the time from the first write to the last row's
// delivery.
func (b *horizonBench) drain(ctx context.Context, n int) (float64, error) {
	if err := b.failed(); err != nil {
		return 0, err
	}
	want := make(map[string]bool, n)
	var ids []uuid.UUID
	began := time.Now()
	for lo := 0; lo < n; lo += backlogTx {
		msgs := make([]messaging.Message, min(backlogTx, n-lo))
		for i := range msgs {
			msgs[i] = benchMessage{Type: backlogType + "." + b.mode, ID: uuid.NewString(), Seq: lo + i}
		}
		err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			got, err := horizonWriter.Write(ctx, tx, messaging.Cause{}, msgs...)
			ids = append(ids, got...)
			return err
		})
		if err != nil {
			return 0, err
		}
	}
	for _, id := range ids {
		want[id.String()] = true
	}
	timeout := time.After(10 * time.Minute)
	for len(want) > 0 {
		select {
		case d, ok := <-b.got:
			if !ok {
				return 0, errors.New("the backlog's consumer was closed")
			}
			delete(want, d.MessageId) // a row of an earlier drain published twice is not one of these
		case <-timeout:
			return 0, fmt.Errorf("%d of %d rows not delivered within 10 minutes", len(want), n)
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	return rowsPerSecond(n, time.Since(began)), nil
}

// pin opens the session that holds the database's horizon: a snapshot
// taken and kept, idle in transaction.
func (b *horizonBench) pin(ctx context.Context) error {
	cfg, err := pgx.ParseConfig(b.dbURL)
	if err != nil {
		return err
	}
	cfg.RuntimeParams["application_name"] = "bench-horizon-pin"
	if b.pinConn, err = pgx.ConnectConfig(ctx, cfg); err != nil {
		return err
	}
	if b.pinTx, err = b.pinConn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead}); err != nil {
		return err
	}
	_, err = b.pinTx.Exec(ctx, "SELECT 1")
	return err
}

// unpin ends the pin's transaction and session.
func (b *horizonBench) unpin(ctx context.Context) {
	if b.pinTx != nil {
		_ = b.pinTx.Rollback(ctx)
		b.pinTx = nil
	}
	if b.pinConn != nil {
		_ = b.pinConn.Close(ctx)
		b.pinConn = nil
	}
}

// horizonStats are the figures orderctl status shows of the outbox.
type horizonStats struct {
	dead int64         // message_outbox's dead tuples, over its partitions
	held time.Duration // how long the oldest session has held the horizon
}

func (b *horizonBench) stats(ctx context.Context) (horizonStats, error) {
	tables, err := tablestats.Tables(ctx, b.pool, "message_outbox")
	if err != nil {
		return horizonStats{}, err
	}
	holders, err := tablestats.Horizon(ctx, b.pool)
	if err != nil {
		return horizonStats{}, err
	}
	var st horizonStats
	if len(tables) == 1 {
		st.dead = tables[0].DeadTuples
	}
	st.held = tablestats.OldestAge(holders, tablestats.KindSession)
	return st, nil
}

// close stops the relay and the load and drops the database (with the
// relay's slot).
func (b *horizonBench) close(ctx context.Context, serverURL string) {
	b.unpin(ctx)
	if b.stop != nil {
		b.stop()
		b.done.Wait()
	}
	if b.amqp != nil {
		_ = b.amqp.Close()
	}
	if b.relay != nil {
		b.relay.Close()
	}
	if b.pool != nil {
		b.pool.Close()
	}
	_ = sandbox.DropDatabase(ctx, serverURL, b.dbName)
}
