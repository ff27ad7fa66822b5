package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/yourorg/orders/internal/auth"
	"github.com/yourorg/orders/lab/sandbox"
)

// closedRun is one closed-loop run (-closed): order-api's, or the raw
// pgx loop's.
type closedRun struct {
	mode string // "api", "api-old" or "raw"
	name string // of its database
	// errors counts the orders not written, by loadgen's reason.
	errors map[string]int
	round  int
	rate   float64 // orders (transactions) per second
	n      int
	cpu    []cpuUse
	db     dbCost
	secs   float64
}

// runClosed measures order-api against its floor (-closed): in each of
// -rounds rounds, on a fresh database each, loadgen posts -orders orders
// to order-api (auth on, each with an Idempotency-Key), -closed at a time,
// and, in a process of its own as well, writes as many orders straight to
// the database at the same concurrency (BEGIN; INSERT order; INSERT outbox
// row; COMMIT), the two alternating which goes first. It prints both rates
// and their ratio, the median of the rounds, with the CPU of each process
// and the statements per order. With -against, the order-api of that git
// revision ("api-old") runs in each round too, against the same loop.
func runClosed(ctx context.Context, cfg config, bins map[string]string, dir string, stdout io.Writer) error {
	var runs []closedRun
	for round := 1; round <= cfg.rounds; round++ {
		modes := []string{"raw", "api"}
		if cfg.against != "" {
			modes = append(modes, "api-old")
		}
		if round%2 == 0 {
			slices.Reverse(modes)
		}
		for _, mode := range modes {
			logs := filepath.Join(dir, fmt.Sprintf("logs-closed-%s-%d", mode, round))
			if err := os.Mkdir(logs, 0o755); err != nil {
				return err
			}
			bin := bins["new"]
			if mode == "api-old" {
				bin = bins["old"]
			}
			// The one loadgen, this checkout's, drives both.
			r, err := closedOnce(ctx, cfg, bin, bins["new"], logs, mode)
			if err != nil {
				return fmt.Errorf("round %d, %s: %w (logs in %s)", round, mode, err, logs)
			}
			r.round = round
			r.print(stdout, cfg.top)
			runs = append(runs, r)
		}
	}
	rates := map[string][]float64{}
	for _, r := range runs {
		rates[r.mode] = append(rates[r.mode], r.rate)
	}
	api, raw := median(rates["api"]), median(rates["raw"])
	_, err := fmt.Fprintf(stdout, "\nPOST /v1/orders %.0f orders/s, raw pgx loop %.0f tx/s: ratio %.2f (median of %d rounds; api %s, raw %s; %d at a time)\n",
		api, raw, api/raw, cfg.rounds, rateList(rates["api"]), rateList(rates["raw"]), cfg.closed)
	if err != nil || cfg.against == "" {
		return err
	}
	old := median(rates["api-old"])
	_, err = fmt.Fprintf(stdout, "order-api of %s %.0f orders/s: ratio %.2f (rounds: %s)\n", cfg.against, old, old/raw, rateList(rates["api-old"]))
	return err
}

// closedOnce runs one closed loop on a database of its own, and drops it.
func closedOnce(ctx context.Context, cfg config, bin, loadgen, logs, mode string) (res closedRun, err error) {
	res.mode = mode
	name := sandbox.UniqueName("orders_closed_")
	res.name = name
	dbURL, err := sandbox.WithPath(cfg.databaseURL, name)
	if err != nil {
		return res, fmt.Errorf("DATABASE_URL: %w", err)
	}
	defer func() {
		err = errors.Join(err, sandbox.DropDatabase(context.WithoutCancel(ctx), cfg.databaseURL, name))
	}()
	env := []string{"DATABASE_URL=" + dbURL, "LOG_FORMAT=json"}
	migrate := exec.CommandContext(ctx, filepath.Join(bin, "order-api"), "migrate", "up")
	migrate.Env = append(os.Environ(), env...)
	if out, err := migrate.CombinedOutput(); err != nil {
		return res, fmt.Errorf("order-api migrate up: %w\n%s", err, out)
	}

	args := []string{"-closed", strconv.Itoa(cfg.closed), "-orders", strconv.Itoa(cfg.orders)}
	pids := map[string]int{}
	var api *sandbox.Process
	defer func() {
		if api != nil {
			err = errors.Join(err, api.Stop())
		}
	}()
	if mode == "raw" {
		args = append(args, "-raw-database", dbURL)
	} else {
		// The API as make run starts it, with auth on: loadgen is an
		// operator.
		secret := rand.Text() + rand.Text()
		token, err := auth.Mint([]byte(secret), auth.Principal{Subject: "bench-flow", Role: auth.RoleOperator}, 24*time.Hour, "", "")
		if err != nil {
			return res, err
		}
		addr, err := sandbox.FreeAddr(ctx)
		if err != nil {
			return res, err
		}
		env = append(env, "HTTP_ADDR="+addr, "API_AUTH=jwt", "API_JWT_SECRET="+secret,
			"API_JWT_PUBLIC_KEYS=", "API_JWT_ISSUER=", "API_JWT_AUDIENCE=")
		api, err = sandbox.Start(ctx, "order-api", filepath.Join(bin, "order-api"), "http://"+addr+"/readyz", logs, env...)
		if err != nil {
			return res, err
		}
		pids["order-api"] = api.Cmd.Process.Pid
		args = append(args, "-api", "http://"+addr, "-token", token)
	}

	dbBefore, err := readDBCost(ctx, cfg.databaseURL, dbURL, name)
	if err != nil {
		return res, err
	}
	before, err := sampleCPU(pids)
	if err != nil {
		return res, err
	}
	lg := exec.CommandContext(ctx, filepath.Join(loadgen, "loadgen"), args...)
	lg.Stderr = os.Stderr
	out, lgErr := lg.Output()
	if lg.ProcessState == nil {
		return res, fmt.Errorf("loadgen: %w", lgErr)
	}
	after, err := sampleCPU(pids)
	if err != nil {
		return res, err
	}
	var s struct {
		Orders  int            `json:"orders"`
		Errors  map[string]int `json:"errors"`
		Seconds float64        `json:"seconds"`
		Rate    float64        `json:"rate"`
	}
	// loadgen exits 1 when an order was not written (a 503 on a starved
	// machine): the run is still reported, its failures with it.
	if err := json.Unmarshal(out, &s); err != nil || s.Orders == 0 {
		return res, fmt.Errorf("loadgen: %w (its summary: %s)", errors.Join(lgErr, err), out)
	}
	res.rate, res.n, res.secs, res.errors = s.Rate, s.Orders, s.Seconds, s.Errors
	if api != nil {
		res.cpu = append(res.cpu, cpuUse{name: "order-api", seconds: seconds(after.children["order-api"] - before.children["order-api"])})
		// Its backends send their counters when they end.
		err = api.Stop()
		api = nil
		if err != nil {
			return res, err
		}
	}
	res.cpu = append(res.cpu,
		cpuUse{name: "loadgen (the client)", seconds: (lg.ProcessState.UserTime() + lg.ProcessState.SystemTime()).Seconds()},
		serverUse(cfg.serverPID, before, after),
		cpuUse{name: machineName, seconds: seconds(after.machine - before.machine), shared: true})
	dbAfter, err := readDBCost(ctx, cfg.databaseURL, dbURL, name)
	if err != nil {
		return res, err
	}
	res.db = dbAfter.since(dbBefore)
	return res, nil
}

func (r closedRun) print(w io.Writer, top int) {
	var b strings.Builder
	fmt.Fprintf(&b, "\nround %d, %s (database %s): %d orders in %.1f s, %.0f/s; not written: %s\n", r.round, r.mode, r.name, r.n, r.secs, r.rate, tally(r.errors))
	for _, c := range r.cpu {
		name := c.name
		if c.shared {
			name += " *"
		}
		fmt.Fprintf(&b, "  %-36s %6.2f s  %6.3f ms per order  %5.1f%% of one core\n", name, c.seconds,
			1000*c.seconds/float64(max(r.n, 1)), 100*c.seconds/r.secs)
	}
	if r.db.statements != nil {
		stmts := slices.SortedFunc(maps.Values(r.db.statements), func(a, b statement) int { return int(b.calls - a.calls) })
		total := 0.0
		for _, s := range stmts {
			total += float64(s.calls)
		}
		fmt.Fprintf(&b, "  statements per order %.2f (commits %.2f), the most called:\n", total/float64(max(r.n, 1)), float64(r.db.commits)/float64(max(r.n, 1)))
		for _, s := range stmts[:min(top, len(stmts))] {
			fmt.Fprintf(&b, "    %6.3f  %s\n", float64(s.calls)/float64(max(r.n, 1)), oneLine(s.query, 110))
		}
	}
	_, _ = io.WriteString(w, b.String())
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(xs))
	return s[len(s)/2]
}

func rateList(xs []float64) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = fmt.Sprintf("%.0f", x)
	}
	return strings.Join(parts, " ")
}

// closedMode is run for -closed: the server, then the closed loops.
func closedMode(ctx context.Context, cfg config, bins map[string]string, dir string, stdout io.Writer, keep *bool) error {
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
	err := runClosed(ctx, cfg, bins, dir, stdout)
	*keep = err != nil && ctx.Err() == nil
	return err
}
