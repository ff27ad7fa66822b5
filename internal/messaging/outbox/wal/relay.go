package wal

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"go.opentelemetry.io/otel/metric"

	"github.com/yourorg/orders/internal/background"
	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/messaging"
	"github.com/yourorg/orders/internal/messaging/outbox"
)

// Config configures the log-tailing relay. Zero fields take the
// defaults noted on each.
type Config struct {
	// Slot is the logical replication slot the relay streams. The relay
	// creates it on its first start. Default "orders_outbox_relay".
	Slot string
	// Publication is the publication of the outbox table
	// (migrations/00004_publication.sql). Default "orders_outbox".
	Publication string
	// Heartbeat is how often the streaming relay writes a logical message
	// into the log, so that the slot moves on, and retains no WAL, while
	// the outbox is quiet. Default 10s.
	Heartbeat time.Duration
	// SweepAfter is how long after the newest transaction the stream has
	// finished a row must still be PENDING for the sweep to publish it
	// (the rows before a slot the relay makes go out at once instead).
	// Keep it above the longest transaction that writes outbox rows: a row
	// written earlier and committed later than that is published twice.
	// Default 30s.
	SweepAfter time.Duration
	// StatusInterval is how often the relay reports its position to the
	// server. Default 1s.
	StatusInterval time.Duration
	// ReplicationURL is the replication connection's server, database and
	// role: a role with the REPLICATION attribute, which needs no grant
	// (the order service's orders_relay_wal). The pool's role, which reads
	// and writes back the rows, needs no REPLICATION then. Default: the
	// pool's settings, the same role.
	ReplicationURL string
}

func (c *Config) setDefaults() {
	c.Slot = cmp.Or(c.Slot, "orders_outbox_relay")
	c.Publication = cmp.Or(c.Publication, "orders_outbox")
	c.Heartbeat = cmp.Or(c.Heartbeat, 10*time.Second)
	c.SweepAfter = cmp.Or(c.SweepAfter, 30*time.Second)
	c.StatusInterval = cmp.Or(c.StatusInterval, time.Second)
}

// Relay publishes the outbox from the write-ahead log.
type Relay struct {
	cfg   outbox.Config
	wal   Config
	sweep *outbox.Relay // the polling relay, restricted to what the stream hands over or missed
	pool  *pgxpool.Pool
	log   *slog.Logger

	streaming atomic.Bool            // this relay streams the slot
	standby   atomic.Bool            // another relay streams it; this one waits
	down      atomic.Pointer[string] // why the stream is down, while it is
	lastEnd   atomic.Pointer[txEnd]  // the newest transaction written back
	// slotSeen: this relay has found or made the slot, so a slot missing
	// later was lost.
	slotSeen atomic.Bool
	// stale: the slot's stream failed on a publication that exists: the
	// slot predates it, and can never be decoded. The next session drops
	// it and makes it again (dropStaleSlot).
	stale   atomic.Bool
	metrics *metrics
}

// errStandby ends a stream session that found the slot streamed by another
// relay.
var errStandby = errors.New("the slot is streamed by another relay")

// NewRelay returns a log-tailing relay; Run starts it. cfg is the
// polling relay's configuration, which the sweep and the publishing share
// (attempts, backoff, confirm timeout, in-flight window, readers,
// partitions).
func NewRelay(cfg outbox.Config, wal Config, deps messaging.Deps) (*Relay, error) {
	wal.setDefaults()
	sweepCfg := cfg
	sweepCfg.NotifyOff = true // the stream sees every commit; the sweep only needs its poll
	sweep, err := outbox.NewRelay(sweepCfg, deps)
	if err != nil {
		return nil, err
	}
	w := &Relay{
		cfg: sweep.Config(), wal: wal, sweep: sweep, pool: deps.Pool,
		log: deps.Logger.With(slog.String("relay_id", sweep.ID()), slog.String("relay_mode", "wal"), slog.String("slot", wal.Slot)),
	}
	sweep.ClaimOnlyBefore(w.sweepCutoff)
	sweep.ClaimEveryPartition()
	if w.metrics, err = newMetrics(deps.MeterProvider.Meter(scope), w); err != nil {
		return nil, err
	}
	return w, nil
}

// ID is the relay's id.
func (w *Relay) ID() string { return w.sweep.ID() }

// Streaming reports whether this relay streams the slot now (not a
// standby).
func (w *Relay) Streaming() bool { return w.streaming.Load() }

// Ready reports whether the relay can publish: the sweep's broker
// connection, readers and database (Relay.Ready), and the log stream
// running or standing by.
func (w *Relay) Ready(ctx context.Context) error {
	if err := w.sweep.Ready(ctx); err != nil {
		return err
	}
	if w.streaming.Load() || w.standby.Load() {
		return nil
	}
	if why := w.down.Load(); why != nil {
		return fmt.Errorf("log stream down: %s", *why)
	}
	return errors.New("log stream not started yet")
}

// sweepCutoff says which rows the sweep may take: while this relay
// streams, PENDING rows written SweepAfter before the newest transaction
// it has finished (and rows whose last publish failed).
func (w *Relay) sweepCutoff() (time.Time, bool) {
	end := w.lastEnd.Load()
	if !w.streaming.Load() || end == nil {
		return time.Time{}, false
	}
	return end.commitTime.Add(-w.wal.SweepAfter), true
}

// Run checks that the server can stream the outbox, then publishes until
// ctx ends: the log stream (one session per replication connection,
// stream.go) and the sweep. A server that cannot do logical replication
// is an error at once, saying what to change.
func (w *Relay) Run(ctx context.Context) error {
	if err := w.checkServer(ctx); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	var sweepErr error
	wg.Go(func() {
		if sweepErr = w.sweep.Run(ctx); sweepErr != nil {
			cancel()
		}
	})
	w.log.InfoContext(ctx, "log-tailing relay starting", slog.String("publication", w.wal.Publication),
		slog.Int("max_in_flight", w.cfg.MaxInFlight))
	streamErr := w.streamLoop(ctx)
	cancel()
	wg.Wait()
	if err := errors.Join(streamErr, sweepErr); err != nil {
		return err
	}
	w.log.InfoContext(ctx, "log-tailing relay stopped")
	return nil
}

// streamLoop runs stream sessions until ctx ends: again after a failure,
// with backoff; every PollInterval while another relay holds the slot.
func (w *Relay) streamLoop(ctx context.Context) error {
	failures := 0
	for {
		streamed, err := w.streamOnce(ctx)
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, errStandby):
			if !w.standby.Swap(true) {
				w.log.InfoContext(ctx, "another relay streams the slot: standing by")
			}
			failures = 0
			background.Sleep(ctx, w.cfg.PollInterval)
			continue
		}
		w.standby.Store(false)
		if streamed {
			failures = 0
		}
		failures++
		why := err.Error()
		w.down.Store(&why)
		delay := database.RetryDelay(failures, err, 30*time.Second)
		w.log.WarnContext(ctx, "log stream ended; resuming from the slot", slog.String("error", why), slog.Duration("retry_in", delay))
		background.Sleep(ctx, delay)
	}
}

// checkServer fails at once, saying what to change, when the server cannot
// stream the outbox: wal_level below logical, the publication missing, or
// the replication connection's role without the REPLICATION attribute.
func (w *Relay) checkServer(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, w.cfg.DBTimeout)
	defer cancel()
	repl, err := w.replicationConfig()
	if err != nil {
		return err
	}
	var level string
	var canReplicate, published bool
	err = w.pool.QueryRow(ctx, `SELECT current_setting('wal_level'),
		       coalesce((SELECT rolreplication OR rolsuper FROM pg_roles WHERE rolname = $2), false),
		       EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)`, w.wal.Publication, repl.User).
		Scan(&level, &canReplicate, &published)
	if err != nil {
		return fmt.Errorf("RELAY_MODE=wal: checking the server: %w", err)
	}
	var errs []error
	if level != "logical" {
		errs = append(errs, fmt.Errorf("the server runs wal_level=%s; RELAY_MODE=wal needs wal_level=logical (postgresql.conf or -c wal_level=logical, then restart the server), or run RELAY_MODE=poll", level))
	}
	if !published {
		errs = append(errs, fmt.Errorf("publication %s not found: run the outbox's migrations (outbox.Schema)", w.wal.Publication))
	}
	if !canReplicate {
		errs = append(errs, fmt.Errorf("role %s may not replicate: give the replication connection (RELAY_WAL_DATABASE_URL) a role with REPLICATION, such as orders_relay_wal (docs/security.md#replication)", repl.User))
	}
	return errors.Join(errs...)
}

// predatesPublication reports whether err, a stream's end, says that the
// slot cannot be decoded because it is older than the publication:
// pgoutput fails every change committed before the publication existed
// ("publication ... does not exist", undefined_object), so a slot made
// before it (as Patroni makes a permanent slot as soon as the database
// exists, before the migrations) fails for ever. Only so while the
// publication exists: checkServer made sure it did at the start, and this
// asks again.
func (w *Relay) predatesPublication(ctx context.Context, err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "42704" || !strings.Contains(pgErr.Message, "publication") {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, w.cfg.DBTimeout)
	defer cancel()
	var exists bool
	return w.pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)", w.wal.Publication).Scan(&exists) == nil && exists
}

// dropStaleSlot drops the slot a session found older than the
// publication, so that ensureSlot makes it again: at the end of the log,
// the PENDING rows before it published first. Nothing was ever streamed
// from it.
func (w *Relay) dropStaleSlot(ctx context.Context, repl *pgconn.PgConn) error {
	err := pglogrepl.DropReplicationSlot(ctx, repl, w.wal.Slot, pglogrepl.DropReplicationSlotOptions{Wait: true})
	var pgErr *pgconn.PgError
	if gone := errors.As(err, &pgErr) && pgErr.Code == "42704"; err != nil && !gone {
		return fmt.Errorf("drop replication slot %s, older than publication %s: %w", w.wal.Slot, w.wal.Publication, err)
	}
	w.stale.Store(false)
	w.log.ErrorContext(ctx, "replication slot older than the publication (made before the migrations): nothing in it can be decoded; dropped it, to make it again",
		slog.String("publication", w.wal.Publication))
	return nil
}

// newSlot is a slot ensureSlot created: where it starts, and the snapshot
// it exported, valid until the replication connection's next command.
type newSlot struct {
	start    pglogrepl.LSN
	snapshot string
}

// ensureSlot creates the slot when it does not exist, and returns it then
// (nil when it existed). A slot created now starts at the current end of
// the log: the rows committed before it are not in its stream. Creating
// it waits for every transaction that holds an xid to end.
func (w *Relay) ensureSlot(ctx context.Context, repl *pgconn.PgConn) (*newSlot, error) {
	var db string
	err := w.pool.QueryRow(ctx, "SELECT coalesce(database, '') FROM pg_replication_slots WHERE slot_name = $1", w.wal.Slot).Scan(&db)
	switch {
	case err == nil:
		var mine string
		if err := w.pool.QueryRow(ctx, "SELECT current_database()").Scan(&mine); err != nil {
			return nil, err
		}
		if db != mine {
			return nil, fmt.Errorf("replication slot %s belongs to database %q, not %q: choose another RELAY_WAL_SLOT", w.wal.Slot, db, mine)
		}
		w.slotSeen.Store(true)
		return nil, nil
	case !errors.Is(err, pgx.ErrNoRows):
		return nil, fmt.Errorf("look for replication slot %s: %w", w.wal.Slot, err)
	}
	res, err := pglogrepl.CreateReplicationSlot(ctx, repl, w.wal.Slot, "pgoutput",
		pglogrepl.CreateReplicationSlotOptions{Mode: pglogrepl.LogicalReplication, SnapshotAction: "EXPORT_SNAPSHOT"})
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42710" { // another relay created it just now
		w.slotSeen.Store(true)
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("create replication slot %s: %w", w.wal.Slot, err)
	}
	start, err := pglogrepl.ParseLSN(res.ConsistentPoint)
	if err != nil {
		return nil, fmt.Errorf("replication slot %s: consistent point: %w", w.wal.Slot, err)
	}
	return &newSlot{start: start, snapshot: res.SnapshotName}, nil
}

// rowsBeforeSlot lists, in write order, the PENDING rows a new slot will
// never stream (those committed before it), read through the snapshot it
// exported. Call it before the replication connection's next command.
func (w *Relay) rowsBeforeSlot(ctx context.Context, slot *newSlot) ([]uuid.UUID, error) {
	if strings.ContainsFunc(slot.snapshot, func(r rune) bool { return !strings.ContainsRune("0123456789ABCDEFabcdef-", r) }) {
		return nil, fmt.Errorf("replication slot %s exported snapshot %q", w.wal.Slot, slot.snapshot)
	}
	ctx, cancel := context.WithTimeout(ctx, w.cfg.DBTimeout)
	defer cancel()
	var ids []uuid.UUID
	err := pgx.BeginTxFunc(ctx, w.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET TRANSACTION SNAPSHOT '"+slot.snapshot+"'"); err != nil {
			return err
		}
		var err error
		ids, err = queries.PendingIDs(ctx, tx)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("list the rows written before replication slot %s: %w", w.wal.Slot, err)
	}
	return ids, nil
}

// slotCreated says that the session created the slot, and what is left
// behind: the rows before it, or err when they could not be listed. A slot
// missing where one was expected (this relay had seen it, or rows wait
// before it) is an error, logged and counted with those rows: the stream
// publishes them first (passBacklog).
func (w *Relay) slotCreated(ctx context.Context, slot *newSlot, rows int, err error) {
	w.lastEnd.Store(nil) // the sweep waits for the new slot's first transaction
	expected := w.slotSeen.Swap(true)
	if !expected && rows == 0 && err == nil {
		w.log.InfoContext(ctx, "replication slot created: it starts at the end of the log", slog.String("start", slot.start.String()))
		return
	}
	w.metrics.slotMissing.Add(ctx, 1)
	w.metrics.slotMissingRows.Add(ctx, int64(rows))
	const msg = "replication slot missing (dropped, lost with its server, or never made while rows waited): created it at the end of the log"
	if err != nil {
		w.log.ErrorContext(ctx, msg+"; the rows written before it could not be listed: the sweep takes them after RELAY_WAL_SWEEP_AFTER",
			slog.String("start", slot.start.String()), slog.String("error", err.Error()))
		return
	}
	w.log.ErrorContext(ctx, msg+"; publishing the PENDING rows written before it first",
		slog.String("start", slot.start.String()), slog.Int("rows", rows))
}

// metrics are the log stream's own instruments (docs/observability.md):
// the gauges of the stream and its slot, and the counters of slots found
// missing. The rest are the polling relay's (outbox/metrics.go), shared
// with the sweep.
type metrics struct {
	slotMissing     metric.Int64Counter
	slotMissingRows metric.Int64Counter
}

func newMetrics(meter metric.Meter, w *Relay) (*metrics, error) {
	streaming, err := meter.Int64ObservableGauge("relay.wal.streaming",
		metric.WithDescription("1 while this relay streams the replication slot (RELAY_MODE=wal); 0 while it stands by or the stream is down."))
	if err != nil {
		return nil, err
	}
	lag, err := meter.Int64ObservableGauge("relay.wal.slot.lag", metric.WithUnit("By"),
		metric.WithDescription("WAL written since the slot's confirmed position: what the log stream has yet to publish and write back."))
	if err != nil {
		return nil, err
	}
	retained, err := meter.Int64ObservableGauge("relay.wal.slot.retained", metric.WithUnit("By"),
		metric.WithDescription("WAL the server keeps for the slot (since its restart position). It grows without bound while no relay streams the slot."))
	if err != nil {
		return nil, err
	}
	m := &metrics{}
	if m.slotMissing, err = meter.Int64Counter("relay.wal.slot.missing",
		metric.WithDescription("Times the relay found its replication slot missing where one was expected, and created it again.")); err != nil {
		return nil, err
	}
	if m.slotMissingRows, err = meter.Int64Counter("relay.wal.slot.missing.rows",
		metric.WithDescription("PENDING rows written before a replication slot the relay created again: the stream publishes them first.")); err != nil {
		return nil, err
	}
	_, err = meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		o.ObserveInt64(streaming, boolInt(w.streaming.Load()))
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		var lagBytes, retainedBytes int64
		err := w.pool.QueryRow(ctx, `SELECT coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn), 0)::bigint,
		       coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn), 0)::bigint
		FROM pg_replication_slots WHERE slot_name = $1`, w.wal.Slot).Scan(&lagBytes, &retainedBytes)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil // no slot yet: nothing retained
		}
		if err != nil {
			return err
		}
		o.ObserveInt64(lag, lagBytes)
		o.ObserveInt64(retained, retainedBytes)
		return nil
	}, streaming, lag, retained)
	return m, err
}

// scope is the instrumentation scope of the log stream's metrics: the
// outbox's, as the relay's own instruments.
const scope = "github.com/yourorg/orders/internal/messaging/outbox"

func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}
