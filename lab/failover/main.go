// Command failover fails a PostgreSQL primary over again and again under
// a steady flow of orders, and says what each failover cost and whether
// the promise held.
//
//	go run ./lab/failover -n 10 -mode both -rate 10   # or: make failover
//
// For each relay mode (-mode poll, wal or both, one after the other) it
// starts etcd and two PostgreSQL 15 nodes under Patroni on this machine
// (Debian's patroni, etcd-server and postgresql-15, as make test/ha), a
// leader and its synchronous standby, with the log-tailing relay's slot
// as a Patroni permanent slot in wal mode; builds and runs order-api, an
// outbox-relay and order-consumer on the nodes' multi-host URL
// (target_session_attrs=read-write) and a vhost of the local RabbitMQ
// (AMQP_URL); posts -rate orders a second, each under an Idempotency-Key
// until it is answered 201; and fails the cluster over -n times, a kill
// of the leader (kill -9, then started again to rejoin) and a Patroni
// switchover in turn. The harness is test/e2e's TestAPrimaryDiesUnderLoad's
// (internal/testenv/failover).
//
// It prints, per failover, its kind and the seconds from it to the new
// leader taking writes, to the next 201, to the relay publishing again,
// to the consumer applying again, the creates refused (503) and
// unanswered, and the latest message (from its outbox row to its
// publish); then p50 and p99 of each, by kind and for all, and the lost
// orders, ghost messages and messages applied twice. The exit status is
// 1 when anything of the promise broke.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/yourorg/orders/internal/testenv/failover"
	"github.com/yourorg/orders/lab/sandbox"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	switch {
	case errors.Is(err, flag.ErrHelp):
	case err != nil:
		fmt.Fprintf(os.Stderr, "failover: %v\n", err)
		os.Exit(1)
	}
}

// config is what the flags set.
type config struct {
	n     int             // failovers per mode
	modes []failover.Mode // in the order they run
	rate  int             // orders per second
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	var cfg config
	fs := flag.NewFlagSet("failover", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&cfg.n, "n", 10, "failovers per relay mode, a kill and a switchover in turn")
	mode := fs.String("mode", "both", "the outbox-relay's RELAY_MODE: poll, wal, or both (one after the other)")
	fs.IntVar(&cfg.rate, "rate", 10, "orders per second")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	switch {
	case fs.NArg() > 0:
		return cfg, fmt.Errorf("unexpected arguments %q", fs.Args())
	case cfg.n <= 0:
		return cfg, errors.New("-n must be more than 0")
	case cfg.rate <= 0 || cfg.rate > 1000:
		return cfg, errors.New("-rate must be 1 to 1000")
	}
	if *mode == "both" {
		cfg.modes = []failover.Mode{failover.Poll, failover.WAL}
		return cfg, nil
	}
	m, err := failover.ParseMode(*mode)
	if err != nil {
		return cfg, fmt.Errorf("-mode: %w, or both", err)
	}
	cfg.modes = []failover.Mode{m}
	return cfg, nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	// testenv asks testing.Short() whether it may use servers: the test
	// flags must exist and be parsed (none is set).
	testing.Init()
	if err := flag.CommandLine.Parse(nil); err != nil {
		return err
	}
	logf := func(format string, a ...any) {
		_, _ = fmt.Fprintf(stdout, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, a...)...)
	}

	// The binaries, and a folder of logs per mode: kept, and named, when
	// something failed.
	dir, err := os.MkdirTemp("", "lab-failover-")
	if err != nil {
		return err
	}
	keep := false
	defer func() {
		if !keep {
			_ = os.RemoveAll(dir)
		}
	}()
	logf("building order-api, outbox-relay and order-consumer")
	if err := sandbox.Build(ctx, dir, "cmd/order-api", "cmd/outbox-relay", "cmd/order-consumer"); err != nil {
		return err
	}
	var results []*outcome
	for _, mode := range cfg.modes {
		logDir := filepath.Join(dir, string(mode))
		if err := os.Mkdir(logDir, 0o755); err != nil {
			return err
		}
		logf("%s: %d failovers at %d orders/s", mode, cfg.n, cfg.rate)
		started := time.Now()
		o := runCampaign(ctx, mode, cfg.n, cfg.rate, dir, logDir, logf)
		logf("%s: done in %s", mode, time.Since(started).Round(time.Second))
		results = append(results, o)
		if ctx.Err() != nil {
			break
		}
	}
	for _, o := range results {
		writeReport(stdout, o, cfg.rate)
	}
	if err := describe(results); err != nil {
		keep = true
		return fmt.Errorf("%w; the processes' logs are in %s", err, dir)
	}
	return nil
}
