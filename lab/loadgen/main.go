// Command loadgen posts orders to a running order-api at a steady rate for
// a fixed time, waits until every order it created has reached a final
// status (FULFILLED, REJECTED or CANCELLED), and reports the throughput and
// the latency from each POST to its order's final status.
//
//	loadgen -rate 50 -duration 30s                 # or: make load RATE=50 DURATION=30s
//	loadgen -rate 50 -duration 30s -chart lat.svg  # and a latency-over-time chart
//	loadgen -json ...                              # the summary as JSON on stdout
//	loadgen -closed 8 -orders 3000                 # a closed loop: 8 clients, the rate as JSON
//	loadgen -closed 8 -raw-database URL            # the same writes straight to PostgreSQL
//
// The load is open: a POST leaves at its scheduled time whatever the
// answers to the earlier ones, as real clients would send, so a slow system
// builds a backlog instead of slowing the load down. At most -concurrency
// POSTs are in flight; an order due while all of them are is not sent and
// is counted as dropped.
//
// When sending is over, loadgen reads the list endpoint (GET /v1/orders,
// newest first, page after page back to the oldest order still pending)
// until every order is final or -wait has passed. It polls only then, so
// that while the load runs the system serves nothing but the POSTs.
//
// An order's latency is its POST's round trip plus the time from its
// created_at to its updated_at when final, both written by the database's
// clock, so the client's clock need not agree with the server's. It
// overstates the true figure by the time from the order's insert to the
// POST's answer (the commit and the response), and leaves out the commit of
// the final transition: about a millisecond each on one machine.
//
// Every request carries a bearer token: -token, else API_TOKEN, else an
// operator token minted with API_JWT_SECRET when it is set (make load
// passes the development secret of make dev); none for an API with
// API_AUTH=off.
//
// The exit status is 0 when every order due was created and reached a final
// status, 1 when one did not (an error, a drop, or still pending after
// -wait) or the run was interrupted, 2 for bad flags.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/yourorg/orders/internal/auth"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	switch {
	case errors.Is(err, flag.ErrHelp):
		os.Exit(0)
	case errors.Is(err, errUsage):
		os.Exit(2)
	case err != nil:
		fmt.Fprintf(os.Stderr, "loadgen: %v\n", err)
		os.Exit(1)
	}
}

var errUsage = errors.New("bad flags")

// config is what the flags set.
type config struct {
	api         string        // the order-api's base URL
	token       string        // the bearer token of every request, or ""
	rate        float64       // orders per second
	duration    time.Duration // how long to send
	concurrency int           // POSTs in flight at most
	wait        time.Duration // how long to wait for final statuses after sending
	chart       string        // an SVG file to write the latency chart to, or ""
	json        bool          // the summary as JSON on stdout
	closed      int           // clients of a closed loop (0: the open load)
	orders      int           // orders the closed loop writes
	rawDatabase string        // the closed loop writes here, not through the API
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("loadgen", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.api, "api", "http://127.0.0.1:8080", "the order-api's base URL")
	fs.StringVar(&c.token, "token", "", "the bearer token for order-api (default: API_TOKEN, else one minted with API_JWT_SECRET)")
	fs.Float64Var(&c.rate, "rate", 20, "orders per second")
	fs.DurationVar(&c.duration, "duration", 10*time.Second, "how long to send orders")
	fs.IntVar(&c.concurrency, "concurrency", 64, "POSTs in flight at most; an order due while all are is dropped")
	fs.DurationVar(&c.wait, "wait", time.Minute, "how long to wait, after sending, for every order to reach a final status")
	fs.StringVar(&c.chart, "chart", "", "write a chart of latency over time to this SVG file")
	fs.BoolVar(&c.json, "json", false, "print the summary as JSON (progress goes to stderr)")
	fs.IntVar(&c.closed, "closed", 0, "instead: a closed loop of this many clients, each posting its next order (with an Idempotency-Key) when its last is answered; prints the rate as JSON")
	fs.IntVar(&c.orders, "orders", 3000, "with -closed: how many orders to write")
	fs.StringVar(&c.rawDatabase, "raw-database", "", "with -closed: write each order and its outbox row straight to this database (BEGIN; INSERT; INSERT; COMMIT), not through the API")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return c, err
		}
		return c, errUsage
	}
	u, err := url.Parse(c.api)
	switch {
	case fs.NArg() > 0:
		err = fmt.Errorf("unexpected arguments %q", fs.Args())
	case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
		err = fmt.Errorf("-api %q is not an http(s) URL", c.api)
	case c.rate <= 0:
		err = errors.New("-rate must be more than 0")
	case c.duration <= 0:
		err = errors.New("-duration must be more than 0")
	case expected(c.rate, c.duration) < 1:
		err = fmt.Errorf("-rate %g for -duration %s is less than one order", c.rate, c.duration)
	case c.concurrency < 1:
		err = errors.New("-concurrency must be at least 1")
	case c.wait < 0:
		err = errors.New("-wait must not be negative")
	case c.closed < 0 || (c.closed > 0 && c.orders < 1):
		err = errors.New("-closed must not be negative, and -orders must be at least 1")
	case c.rawDatabase != "" && c.closed == 0:
		err = errors.New("-raw-database needs -closed")
	default:
		return c, nil
	}
	_, _ = fmt.Fprintf(stderr, "loadgen: %v\n", err)
	fs.Usage()
	return c, errUsage
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	// Progress goes where the summary does not, when the summary is JSON.
	progressOut := stdout
	if cfg.json {
		progressOut = stderr
	}
	if cfg.token == "" && cfg.rawDatabase == "" {
		if cfg.token, err = auth.ClientToken(os.Getenv); err != nil {
			return err
		}
	}
	if cfg.closed > 0 {
		return runClosed(ctx, cfg, stdout)
	}
	g := newGenerator(cfg.api, cfg.token, cfg.concurrency)
	total := expected(cfg.rate, cfg.duration)

	// Send.
	bar := startProgress(progressOut, func() (float64, string) {
		sent, created, failed, dropped, inFlight := g.counts()
		return float64(sent+dropped) / float64(total), fmt.Sprintf("sent %d/%d  created %d  errors %d  dropped %d  in flight %d",
			sent, total, created, failed, dropped, inFlight)
	})
	start, sending := g.send(ctx, cfg.rate, cfg.duration)
	bar.stop()

	// Wait for the final statuses.
	bar = startProgress(progressOut, func() (float64, string) {
		_, created, _, _, _ := g.counts()
		finished := g.finishedCount()
		if created == 0 {
			return 1, "nothing to wait for"
		}
		return float64(finished) / float64(created), fmt.Sprintf("final status %d/%d", finished, created)
	})
	waitErr := g.await(ctx, cfg.wait)
	bar.stop()

	s := g.summary(cfg, total, start, sending)
	if cfg.chart != "" {
		if err := writeChartFile(cfg.chart, s, g.points(start)); err != nil {
			return err
		}
	}
	if cfg.json {
		err = s.writeJSON(stdout)
	} else {
		err = s.writeText(stdout, cfg)
	}
	if err != nil {
		return err
	}

	switch {
	case ctx.Err() != nil:
		return errors.New("interrupted")
	case waitErr != nil && s.Unfinished > 0:
		return fmt.Errorf("%d orders did not reach a final status within -wait %s (last error reading them: %w)", s.Unfinished, cfg.wait, waitErr)
	case s.Unfinished > 0:
		return fmt.Errorf("%d orders did not reach a final status within -wait %s", s.Unfinished, cfg.wait)
	case s.Created < total:
		return fmt.Errorf("%d of %d orders were not created (errors %d, dropped %d)", total-s.Created, total, s.failed(), s.Dropped)
	}
	return nil
}

func writeChartFile(path string, s summary, points []point) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	title := fmt.Sprintf("%d orders at %g/s: POST to final status, p50 %.1f ms, p99 %.1f ms", s.Created, s.Rate, s.Latency.P50, s.Latency.P99)
	if err := writeChart(f, title, time.Duration(s.DurationS*float64(time.Second)), points); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}
