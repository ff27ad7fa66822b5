// Command soak runs the whole flow under failures for a bounded time and
// then checks the promise of the project: no committed order change lost,
// no effect applied twice, no order stuck.
//
//	go run ./lab/soak -duration 10m     # or: make soak (SOAK_DURATION=10m)
//
// It builds order-api, outbox-relay and order-consumer from this checkout,
// creates a fresh database and RabbitMQ vhost on the servers of
// DATABASE_URL and AMQP_URL (by default the local ones), and starts
// order-api, two outbox-relays, order-consumer and a notification webhook
// (in this process, deduplicating on the Idempotency-Key, sometimes
// answering 503 or too late). The relays and the consumer reach PostgreSQL
// and RabbitMQ through TCP proxies in this process, so that their
// connections can be cut without disturbing anyone else on the servers.
//
// For -duration it posts orders at -rate per second (some out of stock,
// some cancelled soon after), while a chaos loop, at random intervals,
//
//   - SIGKILLs the consumer, or a relay, and starts it again;
//   - cuts the relays' and the consumer's connections to PostgreSQL, or to
//     RabbitMQ, for a few seconds (the proxies close them and refuse new
//     ones);
//   - terminates every session of the run's database (pg_terminate_backend);
//   - makes the run's database read-only for a while (ALTER DATABASE ... SET
//     default_transaction_read_only, and its sessions terminated so that
//     they pick it up), then writable again.
//
// Then it heals everything, waits up to -settle for the flow to finish, and
// checks the invariants (see check.go). The exit status is 1 when an order
// is stuck, a message was lost or an effect applied twice.
//
// The database, the vhost and the processes are removed at the end, also
// when the run is interrupted (Ctrl-C); the processes' logs are kept (and
// named) when the check fails.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/yourorg/orders/lab/sandbox"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout)
	switch {
	case errors.Is(err, flag.ErrHelp):
	case err != nil:
		fmt.Fprintf(os.Stderr, "soak: %v\n", err)
		os.Exit(1)
	}
}

// config is what the flags and the environment set.
type config struct {
	duration    time.Duration // how long orders are sent and chaos runs
	rate        float64       // orders per second
	settle      time.Duration // how long to wait, after the chaos, for the flow to finish
	chaosMin    time.Duration // the shortest pause between two faults
	chaosMax    time.Duration // the longest
	seed        uint64        // of the chaos and the load, to repeat a run
	databaseURL string        // the PostgreSQL server (its database is replaced)
	amqpURL     string        // the RabbitMQ server (its vhost is replaced)
	relayMode   string        // RELAY_MODE of the relays: poll or wal
}

func parseFlags(args []string, getenv func(string) string, stderr io.Writer) (config, error) {
	cfg := config{databaseURL: getenv("DATABASE_URL"), amqpURL: getenv("AMQP_URL")}
	if cfg.databaseURL == "" {
		cfg.databaseURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	}
	if cfg.amqpURL == "" {
		cfg.amqpURL = "amqp://guest:guest@127.0.0.1:5672/"
	}
	fs := flag.NewFlagSet("soak", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.DurationVar(&cfg.duration, "duration", 10*time.Minute, "how long to send orders under chaos")
	fs.Float64Var(&cfg.rate, "rate", 10, "orders per second")
	fs.DurationVar(&cfg.settle, "settle", 5*time.Minute, "how long to wait, once the chaos is over, for every order to be final")
	fs.DurationVar(&cfg.chaosMin, "chaos-min", 5*time.Second, "the shortest pause between two faults")
	fs.DurationVar(&cfg.chaosMax, "chaos-max", 20*time.Second, "the longest pause between two faults")
	fs.StringVar(&cfg.relayMode, "relay-mode", "poll", "RELAY_MODE of the relays: poll, or wal (the PostgreSQL of DATABASE_URL must run wal_level=logical)")
	fs.Uint64Var(&cfg.seed, "seed", uint64(time.Now().UnixNano()), "random seed of the chaos and the load")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	switch {
	case fs.NArg() > 0:
		return cfg, fmt.Errorf("unexpected arguments %q", fs.Args())
	case cfg.duration <= 0 || cfg.settle <= 0:
		return cfg, errors.New("-duration and -settle must be more than 0")
	case cfg.rate <= 0:
		return cfg, errors.New("-rate must be more than 0")
	case cfg.relayMode != "poll" && cfg.relayMode != "wal":
		return cfg, fmt.Errorf("-relay-mode must be poll or wal, got %q", cfg.relayMode)
	case cfg.chaosMin <= 0 || cfg.chaosMax < cfg.chaosMin:
		return cfg, errors.New("-chaos-min must be more than 0 and at most -chaos-max")
	}
	return cfg, nil
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) (err error) {
	cfg, err := parseFlags(args, getenv, os.Stderr)
	if err != nil {
		return err
	}
	logf := func(format string, a ...any) {
		_, _ = fmt.Fprintf(stdout, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, a...)...)
	}
	dir, err := os.MkdirTemp("", "soak-")
	if err != nil {
		return err
	}
	keep := false // the logs, when the check fails
	defer func() {
		if keep {
			logf("the processes' logs are in %s", dir)
		} else {
			_ = os.RemoveAll(dir)
		}
	}()

	// Build.
	logf("building order-api, outbox-relay and order-consumer from this checkout")
	if err := sandbox.Build(ctx, dir, "cmd/order-api", "cmd/outbox-relay", "cmd/order-consumer"); err != nil {
		return err
	}
	vhosts, err := sandbox.NewVhostAdmin(ctx, cfg.amqpURL, getenv("RABBITMQ_MANAGEMENT_URL"))
	if err != nil {
		return err
	}

	// Database and vhost, removed whatever happens.
	name := sandbox.UniqueName("orders_soak_")
	dbURL, err := sandbox.WithPath(cfg.databaseURL, name)
	if err != nil {
		return fmt.Errorf("DATABASE_URL: %w", err)
	}
	amqpURL, err := sandbox.WithPath(cfg.amqpURL, name)
	if err != nil {
		return fmt.Errorf("AMQP_URL: %w", err)
	}
	logf("database and vhost %s; seed %d", name, cfg.seed)
	cleanup := context.WithoutCancel(ctx)
	defer func() { err = errors.Join(err, sandbox.DropDatabase(cleanup, cfg.databaseURL, name)) }()
	addErr := vhosts.Add(ctx, name)
	defer func() {
		if rmErr := vhosts.Remove(cleanup, name); addErr == nil {
			err = errors.Join(err, rmErr)
		}
	}()
	if addErr != nil {
		return addErr
	}
	migrate := exec.CommandContext(ctx, filepath.Join(dir, "order-api"), "migrate", "up")
	migrate.Env = append(os.Environ(), "DATABASE_URL="+dbURL, "LOG_FORMAT=json")
	if out, err := migrate.CombinedOutput(); err != nil {
		return fmt.Errorf("order-api migrate up: %w\n%s", err, out)
	}

	// The system: proxies, the webhook, the processes.
	relayEnv := []string{"RELAY_MODE=" + cfg.relayMode, "RELAY_WAL_SLOT=" + name, "RELAY_WAL_SWEEP_AFTER=15s"}
	sys, err := startSystem(ctx, dir, cfg.databaseURL, name, dbURL, amqpURL, relayEnv, logf)
	if sys != nil {
		defer func() { err = errors.Join(err, sys.close()) }()
	}
	if err != nil {
		keep = true
		return err
	}

	// Orders under chaos.
	logf("sending %g orders/s for %s under chaos", cfg.rate, cfg.duration)
	rng := newRand(cfg.seed)
	runCtx, stopRun := context.WithTimeout(ctx, cfg.duration)
	defer stopRun()
	loadDone := make(chan *load, 1)
	go func() { loadDone <- sendOrders(runCtx, sys.apiURL, sys.apiToken, cfg.rate, newRand(cfg.seed+1)) }()
	faults := chaos(runCtx, sys, rng, cfg.chaosMin, cfg.chaosMax, logf)
	ld := <-loadDone
	sys.heal()
	if ctx.Err() != nil {
		return errors.New("interrupted")
	}
	logf("chaos over: %s; %d orders created, %d refused by the API (%s)", tally(faults), len(ld.orders), ld.refusedTotal(), tally(ld.refused))

	// Settle and check.
	if err := sys.settle(ctx, cfg.settle, logf); err != nil {
		keep = true
		return err
	}
	rep, err := check(ctx, sys, ld)
	if err != nil {
		keep = true
		return err
	}
	rep.print(stdout, cfg, faults, ld)
	if !rep.ok() {
		keep = true
		return fmt.Errorf("the promise is broken: %d lost, %d effects applied twice, %d stuck, %d final wrongly", rep.lostTotal(), rep.doubled(), rep.stuck, len(rep.wrong))
	}
	return nil
}
