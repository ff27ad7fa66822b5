// Command bench-volume measures whether the hot paths keep their speed
// under a year of history. It creates two databases of its own on the
// server of DATABASE_URL (by default the local one), migrates both, and
// fills one, inside PostgreSQL (generate_series), with -weeks of history
// in weekly time partitions: -orders orders, each with five PUBLISHED
// outbox rows and five PROCESSED inbox rows (5 million of each by
// default). The other keeps one such order. It then runs the same steps
// on both, alternately, -samples times, and prints each step's median
// time on each and their ratio (the target: 1.2 or less). Both databases
// are dropped at the end, whatever happened, unless -keep keeps the filled
// one; -reuse NAME then measures on it again, without the 13 to 25 minutes
// of filling (its migrations are brought up to date first, and it is kept
// again):
//
//	go run ./lab/bench-volume               # or: make bench/volume
//	go run ./lab/bench-volume -keep         # prints: filling volume_full..._...
//	go run ./lab/bench-volume -reuse volume_full..._...
//
// A database reused grows by what the steps write (a few thousand rows a
// run); drop it with DROP DATABASE when done.
//
// The steps are the statements of each hot path, run in process as the
// service runs them (its pool, in its query mode):
//
//   - poll claim+mark: the polling relay claims a batch of 100 due rows and
//     marks them PUBLISHED (ClaimOutbox, MarkOutbox);
//   - wal write-back: the log-tailing relay's write-back of 100 rows it
//     streamed (MarkStreamed);
//   - consumer batch: a consumer's batch of 50 new messages, deduplicated
//     and recorded (LockInboxKeys, InsertInboxRows, in one transaction);
//   - order timeline: what GET /v1/orders/{id} reads (timeline.Read, in a
//     read-only transaction), for an order in the middle of the history;
//   - orderctl status: its database part (both tables' counts by status,
//     their sizes, stuck rows, the xmin horizon);
//   - retention: the relays' retention turn without the drop (both
//     tables' partitions, and the rows that hold those past retention).
//
// Only what each step writes between samples (the due rows, the new
// messages) is made outside the timing. The machine's other work weighs
// on both databases alike: the samples alternate.
//
// With -horizon it measures instead what a held transaction horizon costs
// the relays (horizon.go):
//
//	go run ./lab/bench-volume -horizon 10m   # or: make bench/horizon HOLD=10m
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/store"
	"github.com/yourorg/orders/lab/sandbox"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr); err != nil {
		_, _ = fmt.Fprintln(os.Stderr, "bench-volume:", err)
		os.Exit(1)
	}
}

// config is the command's flags.
type config struct {
	databaseURL string
	orders      int
	weeks       int
	samples     int
	keep        bool
	reuse       string

	// The held-horizon run (horizon.go), instead of the history's when
	// horizon is above 0.
	horizon        time.Duration
	modes          []string
	horizonRate    int
	horizonBacklog int
	horizonDrains  int
	amqpURL        string
}

func parseFlags(args []string, getenv func(string) string, stderr io.Writer) (config, error) {
	fs := flag.NewFlagSet("bench-volume", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfg := config{}
	fs.StringVar(&cfg.databaseURL, "database-url", firstNonEmpty(getenv("DATABASE_URL"), "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"),
		"a PostgreSQL server on which to create and drop the two databases (DATABASE_URL)")
	fs.IntVar(&cfg.orders, "orders", 1_000_000, "orders in the history; each has 5 outbox and 5 inbox rows")
	fs.IntVar(&cfg.weeks, "weeks", 52, "weeks of history, one time partition each")
	fs.IntVar(&cfg.samples, "samples", 40, "times each step runs on each database")
	fs.BoolVar(&cfg.keep, "keep", false, "keep the filled database (its name is printed), for a look with psql or -reuse")
	fs.StringVar(&cfg.reuse, "reuse", "", "measure on this database, filled and kept by an earlier run (-keep), instead of filling one; it is kept")
	fs.DurationVar(&cfg.horizon, "horizon", 0, "instead: hold each relay's database's xmin horizon this long under a steady load, and compare the relays' drain rates after with before (0: the history run)")
	modes := fs.String("horizon-modes", "poll,wal", "-horizon: the relay modes, poll, wal or both")
	fs.IntVar(&cfg.horizonRate, "horizon-rate", 100, "-horizon: the steady load per mode, outbox rows/s, one per transaction")
	fs.IntVar(&cfg.horizonBacklog, "horizon-backlog", 20_000, "-horizon: the rows of one drain, written at once")
	fs.IntVar(&cfg.horizonDrains, "horizon-drains", 3, "-horizon: drains per mode before the hold and after it (the median counts)")
	fs.StringVar(&cfg.amqpURL, "amqp-url", firstNonEmpty(getenv("AMQP_URL"), "amqp://guest:guest@127.0.0.1:5672/"),
		"-horizon: a RabbitMQ broker on which to create and delete a vhost (AMQP_URL)")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	if cfg.orders < 1 || cfg.weeks < 1 || cfg.samples < 1 {
		return config{}, errors.New("-orders, -weeks and -samples must be at least 1")
	}
	if cfg.horizon < 0 || cfg.horizonRate < 1 || cfg.horizonBacklog < 1 || cfg.horizonDrains < 1 {
		return config{}, errors.New("-horizon must not be negative, and -horizon-rate, -horizon-backlog and -horizon-drains must be at least 1")
	}
	var err error
	if cfg.modes, err = parseModes(*modes); err != nil {
		return config{}, err
	}
	return cfg, nil
}

func firstNonEmpty(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cfg, err := parseFlags(args, getenv, stderr)
	if err != nil {
		return err
	}
	if cfg.horizon > 0 {
		return runHorizon(ctx, cfg, stdout)
	}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))

	// Databases: an empty one, and one with a year of history.
	dbs := make([]*volumeDB, 2)
	for i, kind := range []string{"empty", "full"} {
		name := sandbox.UniqueName("volume_" + kind)
		reused := kind == "full" && cfg.reuse != ""
		if reused {
			name = cfg.reuse
		}
		url, err := sandbox.WithPath(cfg.databaseURL, name)
		if err != nil {
			return err
		}
		if !reused {
			if err := createDatabase(ctx, cfg.databaseURL, name); err != nil {
				return err
			}
		}
		drop := kind != "full" || (!cfg.keep && !reused)
		defer func() {
			if drop {
				_ = sandbox.DropDatabase(context.WithoutCancel(ctx), cfg.databaseURL, name)
			}
		}()
		pool, err := database.NewPool(ctx, database.PoolConfig{URL: url, MaxConns: 4, AppName: "bench-volume"})
		if err != nil {
			return err
		}
		defer pool.Close()
		m, err := store.NewMigrator(pool, logger)
		if err != nil {
			return err
		}
		err = m.Up(ctx)
		_ = m.Close()
		if err != nil {
			return fmt.Errorf("migrate %s: %w", name, err)
		}
		dbs[i] = &volumeDB{kind: kind, name: name, pool: pool}
	}

	// History: the full database's (or the one reused), then the empty
	// one's single order.
	if cfg.reuse != "" {
		if err := dbs[1].reuse(ctx); err != nil {
			return fmt.Errorf("reuse %s: %w", cfg.reuse, err)
		}
	} else {
		start := time.Now()
		_, _ = fmt.Fprintf(stdout, "filling %s: %d weeks, %d orders, %d outbox and %d inbox rows\n",
			dbs[1].name, cfg.weeks, cfg.orders, 5*cfg.orders, 5*cfg.orders)
		if err := dbs[1].fill(ctx, cfg.weeks, cfg.orders, func(done int) {
			_, _ = fmt.Fprintf(stdout, "  %d of %d orders (%s)\n", done, cfg.orders, time.Since(start).Round(time.Second))
		}); err != nil {
			return err
		}
	}
	if err := dbs[0].fill(ctx, 0, 1, func(int) {}); err != nil {
		return err
	}
	for _, db := range dbs {
		if err := db.describe(ctx, stdout); err != nil {
			return err
		}
	}

	// Steps, alternating between the databases.
	_, _ = fmt.Fprintf(stdout, "\n%d samples of each step on each database\n", cfg.samples)
	results := make([][2][]time.Duration, len(steps))
	for s := range cfg.samples {
		for i, st := range steps {
			order := []int{0, 1}
			if s%2 == 1 {
				order = []int{1, 0}
			}
			for _, d := range order {
				took, err := dbs[d].time(ctx, st)
				if err != nil {
					return fmt.Errorf("%s on the %s database: %w", st.name, dbs[d].kind, err)
				}
				results[i][d] = append(results[i][d], took)
			}
		}
	}
	return printResults(stdout, results)
}

// createDatabase creates database name on the server of serverURL.
func createDatabase(ctx context.Context, serverURL, name string) error {
	conn, err := pgx.Connect(ctx, serverURL)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	return err
}

// printResults prints each step's medians and their ratio.
func printResults(w io.Writer, results [][2][]time.Duration) error {
	_, err := fmt.Fprintf(w, "\n%-20s %12s %12s %8s\n", "step", "empty (ms)", "full (ms)", "ratio")
	for i, st := range steps {
		e, f := median(results[i][0]), median(results[i][1])
		_, err2 := fmt.Fprintf(w, "%-20s %12.2f %12.2f %8.2f\n", st.name, ms(e), ms(f), ratio(f, e))
		err = errors.Join(err, err2)
	}
	return err
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// ratio is full over empty; 0 when empty took no time.
func ratio(full, empty time.Duration) float64 {
	if empty <= 0 {
		return 0
	}
	return float64(full) / float64(empty)
}

// median is the middle of ds (the mean of the two middle ones when even).
func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	if n := len(s); n%2 == 0 {
		return (s[n/2-1] + s[n/2]) / 2
	}
	return s[len(s)/2]
}

// volumeDB is one of the two databases.
type volumeDB struct {
	kind  string // "empty" or "full"
	name  string
	pool  *pgxpool.Pool
	order uuid.UUID // the order the timeline step reads
}

// describe prints the database's rows and time partitions.
func (db *volumeDB) describe(ctx context.Context, w io.Writer) error {
	var outbox, inbox, outboxParts, inboxParts int64
	err := db.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM message_outbox), (SELECT count(*) FROM message_inbox),
		(SELECT count(*) FROM pg_inherits WHERE inhparent = 'message_outbox'::regclass),
		(SELECT count(*) FROM pg_inherits WHERE inhparent = 'message_inbox'::regclass)`).Scan(&outbox, &inbox, &outboxParts, &inboxParts)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s database %s: %d outbox rows in %d time partitions, %d inbox rows in %d\n",
		db.kind, db.name, outbox, outboxParts, inbox, inboxParts)
	return err
}

// time runs step st once on db and returns how long it took.
func (db *volumeDB) time(ctx context.Context, st step) (time.Duration, error) {
	var prepared any
	if st.prepare != nil {
		var err error
		if prepared, err = st.prepare(ctx, db); err != nil {
			return 0, fmt.Errorf("prepare: %w", err)
		}
	}
	began := time.Now()
	err := st.run(ctx, db, prepared)
	return time.Since(began), err
}
