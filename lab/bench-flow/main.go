// Command bench-flow measures what an order costs the whole flow. It builds
// order-api, outbox-relay, order-consumer and loadgen from this checkout,
// and for each rate of -rates: creates a fresh database and RabbitMQ vhost,
// migrates, starts order-consumer, -relays outbox-relays and order-api with
// their default settings, drives them with loadgen at that rate for
// -duration, then stops them and deletes the database and the vhost. It
// reports loadgen's latency percentiles (POST to final status) and the CPU
// seconds per 1,000 finished orders of each process, of PostgreSQL and of
// RabbitMQ.
//
//	go run ./lab/bench-flow -rates 50,100,150 -duration 20s   # or: make bench/flow
//	go run ./lab/bench-flow -closed 8                         # or: make bench/api
//
// With -closed it measures order-api alone against its floor instead
// (closed.go): closed loops of loadgen, through the API and straight to
// the database, alternately, and the ratio of their rates.
//
// The servers are those of DATABASE_URL and AMQP_URL (by default the local
// ones); the vhost is made through RabbitMQ's management API, or
// rabbitmqctl when there is none. The notification webhook is off
// (NOTIFY_WEBHOOK_URL unset): the notification consumer records its
// messages and calls nothing.
//
// CPU time is utime + stime from /proc (Linux only), read just before
// loadgen starts and just after it exits, once every order is final (or
// -wait has passed): the window holds the whole processing of every order,
// and loadgen's reading of the list endpoint after sending. For PostgreSQL
// there are two figures: the backends connected to the run's database
// (their queries; not the server's shared work such as WAL writing and
// checkpoints), and the whole server, every process named postgres. The
// RabbitMQ figure is every beam.smp running through the whole window (the
// broker; rabbitmqctl's short-lived VMs are left out). The whole server
// and the broker include what every other client on this machine costs
// them in the window, and "machine" is every process of the machine
// (/proc/stat): on a quiet machine it is close to the sum of the others,
// and when it is far above, something else was running and the shared
// figures are inflated.
package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/yourorg/orders/internal/auth"
	"github.com/yourorg/orders/lab/sandbox"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	switch {
	case errors.Is(err, flag.ErrHelp):
	case err != nil:
		fmt.Fprintf(os.Stderr, "bench-flow: %v\n", err)
		os.Exit(1)
	}
}

// binaries are the commands bench-flow builds from this checkout: the
// service's, and the lab's load generator.
var binaries = []string{"cmd/order-api", "cmd/outbox-relay", "cmd/order-consumer", "lab/loadgen"}

// config is what the flags and the environment set.
type config struct {
	rates       []float64     // orders per second, one run each
	duration    time.Duration // how long loadgen sends, each run
	relays      int           // outbox-relays to start
	partitions  int           // MESSAGE_PARTITIONS of the relays and the consumer
	relayMode   string        // RELAY_MODE of the relays: poll or wal
	wait        time.Duration // loadgen's -wait
	databaseURL string        // the PostgreSQL server (its database is replaced)
	amqpURL     string        // the RabbitMQ server (its vhost is replaced)
	serverPID   int           // the postmaster of the PostgreSQL of its own, or 0
	ownPostgres bool          // start a PostgreSQL of its own instead of DATABASE_URL's
	against     string        // a git revision to build and run alternately with this checkout, or ""
	rounds      int           // runs of each version at each rate
	top         int           // statements listed per run
	closed      int           // clients of the closed loops of order-api against the raw pgx loop (0: the flow)
	orders      int           // orders of each closed loop
}

func parseFlags(args []string, getenv func(string) string, stderr io.Writer) (config, error) {
	cfg := config{databaseURL: getenv("DATABASE_URL"), amqpURL: getenv("AMQP_URL")}
	if cfg.databaseURL == "" {
		cfg.databaseURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	}
	if cfg.amqpURL == "" {
		cfg.amqpURL = "amqp://guest:guest@127.0.0.1:5672/"
	}
	fs := flag.NewFlagSet("bench-flow", flag.ContinueOnError)
	fs.SetOutput(stderr)
	rates := fs.String("rates", "50,100,150", "orders per second, comma-separated: one run each, on a fresh system")
	fs.DurationVar(&cfg.duration, "duration", 20*time.Second, "how long each run sends orders")
	fs.IntVar(&cfg.relays, "relays", 2, "outbox-relays to start")
	fs.IntVar(&cfg.partitions, "partitions", 0, "MESSAGE_PARTITIONS: relays share the outbox by partition, consumers keep each order in order")
	fs.StringVar(&cfg.relayMode, "relay-mode", "poll", "RELAY_MODE of the relays: poll, or wal (the PostgreSQL of DATABASE_URL must run wal_level=logical)")
	fs.DurationVar(&cfg.wait, "wait", 2*time.Minute, "how long each run waits, after sending, for every order to reach a final status")
	fs.BoolVar(&cfg.ownPostgres, "own-postgres", true, "start a PostgreSQL of its own (initdb from the installed binaries, pg_stat_statements loaded, wal_level=logical) rather than use DATABASE_URL's: its WAL, fsyncs and CPU are the run's alone")
	fs.StringVar(&cfg.against, "against", "", "a git revision (the previous main) to build from git and run alternately with this checkout at each rate, printing the ratios of their costs (with -closed: its order-api against the same raw loop)")
	fs.IntVar(&cfg.rounds, "rounds", 0, "runs of each version at each rate (default 1, or 2 with -against)")
	fs.IntVar(&cfg.top, "top", 12, "the statements called most to list for each run")
	fs.IntVar(&cfg.closed, "closed", 0, "instead of the flow: order-api alone, driven by loadgen in a closed loop of this many clients (POST /v1/orders with Idempotency-Keys), against a raw pgx loop at the same concurrency (-rounds of each, alternately, default 3): both rates and the ratio")
	fs.IntVar(&cfg.orders, "orders", 3000, "with -closed: orders each loop writes")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	for _, r := range strings.Split(*rates, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(r), 64)
		if err != nil || v <= 0 {
			return cfg, fmt.Errorf("-rates: %q is not a positive number", r)
		}
		cfg.rates = append(cfg.rates, v)
	}
	switch {
	case fs.NArg() > 0:
		return cfg, fmt.Errorf("unexpected arguments %q", fs.Args())
	case cfg.duration <= 0:
		return cfg, errors.New("-duration must be more than 0")
	case cfg.relays < 1:
		return cfg, errors.New("-relays must be at least 1")
	case cfg.partitions < 0:
		return cfg, errors.New("-partitions must not be negative")
	case cfg.relayMode != "poll" && cfg.relayMode != "wal":
		return cfg, fmt.Errorf("-relay-mode must be poll or wal, got %q", cfg.relayMode)
	case cfg.rounds < 0:
		return cfg, errors.New("-rounds must not be negative")
	case cfg.closed < 0 || (cfg.closed > 0 && cfg.orders < 1):
		return cfg, errors.New("-closed must not be negative, and -orders must be at least 1")
	}
	if cfg.rounds == 0 {
		cfg.rounds = 1
		if cfg.against != "" {
			cfg.rounds = 2
		}
		if cfg.closed > 0 {
			cfg.rounds = 3
		}
	}
	return cfg, nil
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cfg, err := parseFlags(args, getenv, stderr)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "bench-flow-")
	if err != nil {
		return err
	}
	keep := false // the logs, when a run fails
	defer func() {
		if !keep {
			_ = os.RemoveAll(dir)
		}
	}()

	// Build: this checkout's binaries, and those of -against from git
	// (the same loadgen drives both: this checkout's).
	bins := map[string]string{"new": filepath.Join(dir, "new")}
	build := binaries
	if cfg.closed > 0 {
		build = []string{"cmd/order-api", "lab/loadgen"}
	}
	_, _ = fmt.Fprintf(stdout, "building %s from this checkout\n", strings.Join(build, ", "))
	if err := sandbox.Build(ctx, bins["new"], build...); err != nil {
		return err
	}
	if cfg.closed > 0 {
		if cfg.against != "" {
			bins["old"] = filepath.Join(dir, "old")
			_, _ = fmt.Fprintf(stdout, "building order-api from git revision %s\n", cfg.against)
			if err := sandbox.BuildRevision(ctx, cfg.against, bins["old"], dir, "cmd/order-api"); err != nil {
				return err
			}
		}
		return closedMode(ctx, cfg, bins, dir, stdout, &keep)
	}
	versions := []string{"new"}
	if cfg.against != "" {
		bins["old"] = filepath.Join(dir, "old")
		_, _ = fmt.Fprintf(stdout, "building the service's binaries from git revision %s\n", cfg.against)
		if err := sandbox.BuildRevision(ctx, cfg.against, bins["old"], dir, binaries[:3]...); err != nil {
			return err
		}
		if err := os.Link(filepath.Join(bins["new"], "loadgen"), filepath.Join(bins["old"], "loadgen")); err != nil {
			return err
		}
		versions = []string{"new", "old"}
	}
	vhosts, err := sandbox.NewVhostAdmin(ctx, cfg.amqpURL, getenv("RABBITMQ_MANAGEMENT_URL"))
	if err != nil {
		return err
	}
	if cfg.ownPostgres {
		pg, err := sandbox.StartPostgres(ctx)
		if err != nil {
			return fmt.Errorf("-own-postgres: %w", err)
		}
		defer func() { _ = pg.Stop() }()
		cfg.databaseURL, cfg.serverPID = pg.URL, pg.PID
		_, _ = fmt.Fprintf(stdout, "PostgreSQL of its own: %s\n", pg.URL)
	}
	if err := enableStatements(ctx, cfg.databaseURL); err != nil {
		return fmt.Errorf("pg_stat_statements: %w", err)
	}

	// Runs on a fresh system each: at each rate, -rounds of each version,
	// alternating (new then old, then old then new), so that a drift of
	// the machine's load weighs on both alike.
	var results []result
	for _, rate := range cfg.rates {
		for round := range cfg.rounds {
			order := slices.Clone(versions)
			if round%2 == 1 {
				slices.Reverse(order)
			}
			for _, version := range order {
				logs := filepath.Join(dir, fmt.Sprintf("logs-%s-%s-%d", strconv.FormatFloat(rate, 'f', -1, 64), version, round+1))
				if err := os.Mkdir(logs, 0o755); err != nil {
					return err
				}
				_, _ = fmt.Fprintf(stdout, "\n%g orders/s for %s (%s, round %d): order-api, order-consumer and %d outbox-relays (RELAY_MODE=%s), %d partitions\n",
					rate, cfg.duration, version, round+1, cfg.relays, cfg.relayMode, cfg.partitions)
				r, err := benchRate(ctx, cfg, vhosts, bins[version], logs, rate, stdout, stderr)
				r.version = version
				if ctx.Err() != nil {
					// The database and the vhost are gone; err has what went
					// wrong on the way out, if anything did.
					return errors.Join(errors.New("interrupted"), err)
				}
				if err != nil {
					keep = true
					return fmt.Errorf("at %g orders/s (%s): %w (logs in %s)", rate, version, err, logs)
				}
				if err := errors.Join(r.print(stdout), r.printBudget(stdout, cfg.top)); err != nil {
					return err
				}
				results = append(results, r)
			}
		}
	}
	if err := printTable(stdout, cfg, results); err != nil {
		return err
	}
	if cfg.against != "" {
		if err := printComparison(stdout, cfg.against, results); err != nil {
			return err
		}
	}
	for _, r := range results {
		if r.load.Unfinished > 0 || r.load.Created < r.load.Expected {
			return fmt.Errorf("at %g orders/s, not every order due was created and final: the CPU per order is not comparable", r.rate)
		}
	}
	return nil
}

// loadSummary is what bench-flow reads of loadgen's -json summary.
type loadSummary struct {
	Expected   int            `json:"expected"`
	Created    int            `json:"created"`
	Dropped    int            `json:"dropped"`
	Errors     map[string]int `json:"errors"`
	Final      map[string]int `json:"final"`
	Unfinished int            `json:"unfinished"`
	Throughput float64        `json:"throughput"`
	Latency    struct {
		P50 float64 `json:"p50"`
		P90 float64 `json:"p90"`
		P99 float64 `json:"p99"`
		Max float64 `json:"max"`
	} `json:"latency_ms"`
}

// result is one run.
type result struct {
	version  string // "new" (this checkout) or "old" (-against)
	db       dbCost
	rate     float64
	load     loadSummary
	finished int
	window   time.Duration
	cpu      []cpuUse
}

// cpuUse is the CPU time one thing used in the window.
type cpuUse struct {
	name    string
	seconds float64
	shared  bool // a server that other clients on this machine use too
}

// benchRate runs the flow on a fresh database and vhost at rate, and
// removes them afterwards whatever happened.
func benchRate(ctx context.Context, cfg config, vhosts *sandbox.VhostAdmin, bin, logs string, rate float64, stdout, stderr io.Writer) (res result, err error) {
	res.rate = rate
	// Database and vhost.
	name := sandbox.UniqueName("orders_bench_")
	_, _ = fmt.Fprintf(stdout, "database and vhost %s\n", name)
	dbURL, err := sandbox.WithPath(cfg.databaseURL, name)
	if err != nil {
		return res, fmt.Errorf("DATABASE_URL: %w", err)
	}
	amqpURL, err := sandbox.WithPath(cfg.amqpURL, name)
	if err != nil {
		return res, fmt.Errorf("AMQP_URL: %w", err)
	}
	cleanup := context.WithoutCancel(ctx)
	defer func() { err = errors.Join(err, sandbox.DropDatabase(cleanup, cfg.databaseURL, name)) }()
	// Removed even when adding failed half way (interrupted between the
	// vhost and its permissions): only then is a failed removal no news.
	addErr := vhosts.Add(ctx, name)
	defer func() {
		if rmErr := vhosts.Remove(cleanup, name); addErr == nil {
			err = errors.Join(err, rmErr)
		}
	}()
	if addErr != nil {
		return res, addErr
	}
	env := []string{"DATABASE_URL=" + dbURL, "AMQP_URL=" + amqpURL, "LOG_FORMAT=json", fmt.Sprintf("MESSAGE_PARTITIONS=%d", cfg.partitions),
		"RELAY_MODE=" + cfg.relayMode, "RELAY_WAL_SLOT=" + name}

	// Schema: migrate creates the database.
	migrate := exec.CommandContext(ctx, filepath.Join(bin, "order-api"), "migrate", "up")
	migrate.Env = append(os.Environ(), env...)
	if out, err := migrate.CombinedOutput(); err != nil {
		return res, fmt.Errorf("order-api migrate up: %w\n%s", err, out)
	}

	// Services: the consumer first, since it declares the queues the relays
	// publish to; stopped in reverse order at the end.
	procCtx, stopAll := context.WithCancel(ctx)
	defer stopAll()
	var procs []*sandbox.Process
	defer func() {
		for i := len(procs) - 1; i >= 0; i-- {
			err = errors.Join(err, procs[i].Stop())
		}
	}()
	pids := map[string]int{}
	startOne := func(name, binary, readyPath, addrVar string, extra ...string) (string, error) {
		addr, err := sandbox.FreeAddr(ctx)
		if err != nil {
			return "", err
		}
		p, err := sandbox.Start(procCtx, name, filepath.Join(bin, binary), "http://"+addr+readyPath, logs,
			append(append(env, addrVar+"="+addr), extra...)...)
		if p != nil {
			procs = append(procs, p)
		}
		if err != nil {
			return "", err
		}
		pids[name] = p.Cmd.Process.Pid
		return "http://" + addr, nil
	}
	if _, err := startOne("order-consumer", "order-consumer", "/readyz", "ADMIN_ADDR"); err != nil {
		return res, err
	}
	for i := 1; i <= cfg.relays; i++ {
		relay := fmt.Sprintf("outbox-relay-%d", i)
		if _, err := startOne(relay, "outbox-relay", "/readyz", "ADMIN_ADDR", "RELAY_ID="+relay); err != nil {
			return res, err
		}
	}
	// The API verifies tokens with a secret of this run; loadgen gets an
	// operator's token.
	secret := rand.Text() + rand.Text()
	token, err := auth.Mint([]byte(secret), auth.Principal{Subject: "bench-flow", Role: auth.RoleOperator}, 24*time.Hour, "", "")
	if err != nil {
		return res, err
	}
	api, err := startOne("order-api", "order-api", "/readyz", "HTTP_ADDR", "API_AUTH=jwt", "API_JWT_SECRET="+secret,
		"API_JWT_PUBLIC_KEYS=", "API_JWT_ISSUER=", "API_JWT_AUDIENCE=")
	if err != nil {
		return res, err
	}

	// Load, between two readings of the CPU times and the database's
	// counters.
	dbBefore, err := readDBCost(ctx, cfg.databaseURL, dbURL, name)
	if err != nil {
		return res, err
	}
	before, err := sampleCPU(pids)
	if err != nil {
		return res, err
	}
	lg := exec.CommandContext(ctx, filepath.Join(bin, "loadgen"), "-api", api, "-token", token, "-json",
		"-rate", strconv.FormatFloat(rate, 'f', -1, 64), "-duration", cfg.duration.String(), "-wait", cfg.wait.String())
	lg.Stderr = stderr // its progress
	// Interrupted, loadgen stops sending and prints what it has.
	lg.Cancel = func() error { return lg.Process.Signal(os.Interrupt) }
	lg.WaitDelay = 10 * time.Second
	out, lgErr := lg.Output()
	if lg.ProcessState == nil {
		return res, fmt.Errorf("loadgen: %w", lgErr)
	}
	after, err := sampleCPU(pids)
	if err != nil {
		return res, err
	}
	// The processes stop before the database's counters are read: a
	// backend sends its counters when it ends.
	for i := len(procs) - 1; i >= 0; i-- {
		err = errors.Join(err, procs[i].Stop())
	}
	procs = nil
	if err != nil {
		return res, err
	}
	dbAfter, err := readDBCost(ctx, cfg.databaseURL, dbURL, name)
	if err != nil {
		return res, err
	}
	res.db = dbAfter.since(dbBefore)
	if err := json.Unmarshal(out, &res.load); err != nil {
		return res, fmt.Errorf("loadgen: %w (its summary: %v)", errors.Join(lgErr, err), string(out))
	}
	// loadgen exits 1 when an order did not finish: the summary says which,
	// and the run is still reported.

	res.window = after.at.Sub(before.at)
	res.finished = res.load.Created - res.load.Unfinished
	names := append([]string{"order-api"}, relayNames(cfg.relays)...)
	names = append(names, "order-consumer")
	for _, n := range names {
		res.cpu = append(res.cpu, cpuUse{name: n, seconds: seconds(after.children[n] - before.children[n])})
	}
	res.cpu = append(res.cpu,
		cpuUse{name: "PostgreSQL, this database's backends", seconds: seconds(backendsCPU(before, after, name))},
		serverUse(cfg.serverPID, before, after),
		cpuUse{name: "RabbitMQ", seconds: seconds(lastingCPU(before.stats, after.stats, "beam.smp")), shared: true},
		cpuUse{name: "loadgen (the client)", seconds: (lg.ProcessState.UserTime() + lg.ProcessState.SystemTime()).Seconds()},
		cpuUse{name: machineName, seconds: seconds(after.machine - before.machine), shared: true},
	)
	return res, nil
}

func relayNames(n int) []string {
	var out []string
	for i := 1; i <= n; i++ {
		out = append(out, fmt.Sprintf("outbox-relay-%d", i))
	}
	return out
}

// machineName names the row of every process of the machine.
const machineName = "machine (every process)"

// perThousand is seconds per 1,000 finished orders.
func (r result) perThousand(seconds float64) float64 {
	if r.finished == 0 {
		return 0
	}
	return seconds / float64(r.finished) * 1000
}

func (r result) print(w io.Writer) error {
	var b strings.Builder
	l := r.load
	fmt.Fprintf(&b, "%d orders due, %d created, %d final (%s), %d not final; errors %s; dropped %d\n",
		l.Expected, l.Created, r.finished, tally(l.Final), l.Unfinished, tally(l.Errors), l.Dropped)
	fmt.Fprintf(&b, "POST to final status: p50 %.1f ms  p90 %.1f ms  p99 %.1f ms  max %.1f ms; end to end %.1f orders/s\n",
		l.Latency.P50, l.Latency.P90, l.Latency.P99, l.Latency.Max, l.Throughput)
	fmt.Fprintf(&b, "%-38s %8s %17s %13s\n", fmt.Sprintf("CPU over %.1f s", r.window.Seconds()), "seconds", "per 1,000 orders", "% of one core")
	for _, c := range r.cpu {
		name := c.name
		if c.shared {
			name += " *"
		}
		fmt.Fprintf(&b, "  %-36s %8.2f %17.2f %12.1f%%\n", name, c.seconds, r.perThousand(c.seconds), 100*c.seconds/r.window.Seconds())
	}
	b.WriteString("* includes every other client of the server (or process of the machine) in the window\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// printTable prints every run as one Markdown table, for docs/benchmarks.md.
func printTable(w io.Writer, cfg config, results []result) error {
	var b strings.Builder
	fmt.Fprintf(&b, "\nLatency from POST to final status; CPU seconds per 1,000 orders; %s per rate, %d outbox-relays, %d cores\n\n",
		cfg.duration, cfg.relays, runtime.NumCPU())
	header := []string{"orders/s", "final", "end to end/s", "p50 ms", "p90 ms", "p99 ms", "max ms", "order-api", "outbox-relays", "order-consumer",
		"PostgreSQL, its backends", "PostgreSQL, server*", "RabbitMQ*", "loadgen", "machine busy*"}
	fmt.Fprintf(&b, "| %s |\n|%s\n", strings.Join(header, " | "), strings.Repeat("---|", len(header)))
	for _, r := range results {
		// The columns after the latencies, in the order of r.cpu, with the
		// relays added up, and the machine as a share of all its cores.
		var cols []string
		relays := 0.0
		for _, c := range r.cpu {
			switch {
			case strings.HasPrefix(c.name, "outbox-relay-"):
				relays += c.seconds
				if c.name == fmt.Sprintf("outbox-relay-%d", cfg.relays) {
					cols = append(cols, fmt.Sprintf("%.2f", r.perThousand(relays)))
				}
			case c.name == machineName:
				cols = append(cols, fmt.Sprintf("%.0f%%", 100*c.seconds/r.window.Seconds()/float64(runtime.NumCPU())))
			default:
				cols = append(cols, fmt.Sprintf("%.2f", r.perThousand(c.seconds)))
			}
		}
		l := r.load
		fmt.Fprintf(&b, "| %g | %d/%d | %.1f | %.1f | %.1f | %.1f | %.1f | %s |\n", r.rate, r.finished, l.Expected, l.Throughput,
			l.Latency.P50, l.Latency.P90, l.Latency.P99, l.Latency.Max, strings.Join(cols, " | "))
	}
	fmt.Fprintln(&b, "\n* includes every other client of the server (or process of the machine) in the window")
	_, err := io.WriteString(w, b.String())
	return err
}

// tally formats counts as "A 3, B 1", or "none".
func tally(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	var parts []string
	for k, v := range m {
		parts = append(parts, fmt.Sprintf("%s %d", k, v))
	}
	slices.Sort(parts)
	return strings.Join(parts, ", ")
}
