// Package app holds the start-up and shutdown steps the three binaries
// share: the command line (-migrate, the migrate sub-command), opening the
// database, and serving HTTP until the process is told to stop. Each binary's
// main.go reads top to bottom with these as its steps.
package app

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/yourorg/orders/internal/config"
	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/store"
	"github.com/yourorg/orders/internal/telemetry"
)

// Args is the command line every binary takes:
//
//	<binary> [-migrate]                          serve (migrating first with -migrate)
//	<binary> migrate [up|down|status|reset]      manage the schema and exit
//	<binary> <command> [args]                    a command of the binary's own
type Args struct {
	Migrate bool     // -migrate: apply migrations before serving
	Command []string // the sub-command and its arguments, if any
}

// ParseArgs reads the command line of binary name; commands lists the
// sub-commands it has besides migrate, each with a one-line usage.
func ParseArgs(name string, args []string, stderr io.Writer, commands ...string) (Args, error) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	var a Args
	fs.BoolVar(&a.Migrate, "migrate", false, "apply pending migrations before serving (also MIGRATE_ON_START=true)")
	fs.Usage = func() {
		_, _ = fmt.Fprintf(stderr, "usage:\n  %s [-migrate]                       serve\n  %s migrate [up|down|status|reset]   manage the schema and exit\n", name, name)
		for _, c := range commands {
			_, _ = fmt.Fprintf(stderr, "  %s %s\n", name, c)
		}
		_, _ = fmt.Fprintf(stderr, "\nConfiguration is read from the environment; see README.md.\n")
	}
	if err := fs.Parse(args); err != nil {
		return a, err
	}
	a.Command = fs.Args()
	if len(a.Command) == 0 || a.Command[0] == "migrate" {
		return a, nil
	}
	for _, c := range commands {
		if strings.Fields(c)[0] == a.Command[0] {
			return a, nil
		}
	}
	fs.Usage()
	return a, fmt.Errorf("unknown command %q", a.Command[0])
}

// RunMigrate is the migrate sub-command: up (the default), down (one
// step), status, or reset (every migration down, then up: all data is
// lost); after an up, the log-tailing relay's role (store.RelayWALRole).
// It creates the database first if it does not exist. A server that is
// not up yet (docker compose starts everything together) is waited for,
// up to db.ConnectTimeout.
func RunMigrate(ctx context.Context, db config.Database, args []string, logger *slog.Logger, stdout io.Writer) error {
	action := "up"
	if len(args) > 0 {
		action = args[0]
	}
	if action != "up" && action != "down" && action != "status" && action != "reset" {
		return fmt.Errorf("migrate %q: want up, down, status or reset", action)
	}
	if err := ensureDatabase(ctx, db); err != nil {
		return err
	}
	pool, err := database.NewPool(ctx, database.PoolConfig{URL: db.URL, MaxConns: 2, AppName: "migrate", ConnectTimeout: db.ConnectTimeout})
	if err != nil {
		return err
	}
	defer pool.Close()
	m, err := store.NewMigrator(pool, logger)
	if err != nil {
		return err
	}
	defer func() { _ = m.Close() }()
	switch action {
	case "down":
		return m.Down(ctx)
	case "status":
		return m.Status(ctx, stdout)
	case "reset":
		if err := m.DownTo(ctx, 0); err != nil {
			return err
		}
	}
	if err := m.Up(ctx); err != nil {
		return err
	}
	return store.RelayWALRole(ctx, pool, logger, db.MigrateRelayWALRole)
}

// ensureDatabase is store.EnsureDatabase, waiting at most db.ConnectTimeout
// (unset: 30s, as database.NewPool) for the server.
func ensureDatabase(ctx context.Context, db config.Database) error {
	ctx, cancel := context.WithTimeout(ctx, cmp.Or(db.ConnectTimeout, 30*time.Second))
	defer cancel()
	return store.EnsureDatabase(ctx, db.URL)
}

// OpenDatabase opens the pool of a process: pc names it and sets its
// options; db supplies the URL, size and timeouts. With -migrate (migrate)
// or MIGRATE_ON_START it first creates the database if needed and applies
// pending migrations, under goose's advisory lock. Either way it waits up
// to db.ConnectTimeout for a server that is not up yet. Its queries are traced
// and its statistics exported through tel.
func OpenDatabase(ctx context.Context, pc database.PoolConfig, db config.Database, migrate bool, tel *telemetry.Telemetry) (*pgxpool.Pool, error) {
	if migrate || db.MigrateOnStart {
		if err := RunMigrate(ctx, db, []string{"up"}, tel.Logger, io.Discard); err != nil {
			return nil, err
		}
	}
	pc.URL, pc.MaxConns = db.URL, db.MaxConns
	pc.StatementTimeout, pc.LockTimeout = db.StatementTimeout, db.LockTimeout
	pc.ConnectTimeout = db.ConnectTimeout
	pc.Tracer = telemetry.DBTracer(tel.TracerProvider)
	pool, err := database.NewPool(ctx, pc)
	if err != nil {
		return nil, err
	}
	if err := telemetry.RecordPoolStats(pool, tel.MeterProvider); err != nil {
		pool.Close()
		return nil, fmt.Errorf("pool metrics: %w", err)
	}
	return pool, nil
}

// Main is the main function of the binaries: run gets a context that
// SIGINT and SIGTERM cancel (graceful shutdown), the arguments and the
// standard streams; its error is printed and the process exits 1.
func Main(service string, run func(ctx context.Context, args []string, environ map[string]string, stdout, stderr io.Writer) error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], nil, os.Stdout, os.Stderr)
	stop()
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) { // -h printed the usage already
			fmt.Fprintf(os.Stderr, "%s: %v\n", service, err)
		}
		os.Exit(1)
	}
}

// NewHTTPServer returns a server with the timeouts a public listener needs.
func NewHTTPServer(addr string, h http.Handler, logger *slog.Logger) *http.Server {
	return &http.Server{
		Addr:              addr,
		Handler:           h,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       15 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       60 * time.Second,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
}

// drainGrace is how long Serve, shutting down, leaves the connections that
// are open to send one more request, which it answers and then closes the
// connection: longer than the pause between two requests of a busy
// client, short enough not to hold up a restart.
const drainGrace = time.Second

// Serve runs srv until ctx is done, then shuts it down so that no request
// is cut: each is either answered or refused at connect.
//
//  1. It stops accepting connections: a client that connects from now on
//     is refused.
//  2. It stops keeping connections alive: every answer from now on says
//     "Connection: close", and the connection closes after it, so that the
//     client opens a new one for its next request (and is refused) instead
//     of sending it on a connection the server closes meanwhile.
//  3. For drainGrace (at most timeout), it leaves the open connections
//     their next request, answered so, and stops waiting once none is open.
//  4. It closes the connections still idle, which have sent nothing all
//     that time, and waits for the requests in flight, up to timeout in
//     all.
//
// Closing an idle keep-alive connection at once, as http.Server.Shutdown
// does, races with a client that is sending its next request on it: the
// client sees "connection reset by peer" or EOF, and cannot tell whether
// its request was handled. What stays of that race here is a request sent
// at the very end of the grace by a client idle through all of it; and a
// connection the kernel completed but the process had not accepted yet
// when the listener closed is reset (a load balancer that stops sending
// first, SHUTDOWN_DELAY, avoids both).
//
// ready, if not nil, receives the bound address once the server listens.
func Serve(ctx context.Context, srv *http.Server, timeout time.Duration, logger *slog.Logger, ready chan<- net.Addr) error {
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", srv.Addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", srv.Addr, err)
	}
	logger.InfoContext(ctx, "listening", slog.String("addr", ln.Addr().String()))
	if ready != nil {
		ready <- ln.Addr()
	}
	d := newDrain(srv)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()

	select {
	case err := <-errc:
		return fmt.Errorf("serve %s: %w", srv.Addr, err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	d.closing.Store(true)
	if err := ln.Close(); err != nil {
		return fmt.Errorf("stop listening on %s: %w", srv.Addr, err)
	}
	// Serve returns once the listener is closed, with the accept error
	// that says so; the connections live on.
	if err := <-errc; !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("serve %s: %w", srv.Addr, err)
	}
	graceCtx, cancelGrace := context.WithTimeout(shutdownCtx, min(drainGrace, timeout))
	d.wait(graceCtx)
	cancelGrace()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return fmt.Errorf("shut down %s: %w", srv.Addr, err)
	}
	return nil
}

// drain is what Serve needs of a server it shuts down: a switch that makes
// every answer close its connection, and the number of open connections.
type drain struct {
	closing atomic.Bool
	mu      sync.Mutex
	open    int
	changed chan struct{} // closed, and replaced, when open changes
}

// newDrain wraps srv's handler and connection-state hook with a drain's.
func newDrain(srv *http.Server) *drain {
	d := &drain{changed: make(chan struct{})}
	next, hook := srv.Handler, srv.ConnState
	if next == nil {
		next = http.DefaultServeMux
	}
	srv.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(&closingWriter{ResponseWriter: w, drain: d}, r)
	})
	srv.ConnState = func(c net.Conn, state http.ConnState) {
		d.mu.Lock()
		switch state {
		case http.StateNew:
			d.open++
		case http.StateClosed, http.StateHijacked:
			d.open--
		}
		close(d.changed)
		d.changed = make(chan struct{})
		d.mu.Unlock()
		if hook != nil {
			hook(c, state)
		}
	}
	return d
}

// closingWriter says "Connection: close" in an answer written once the
// drain is closing, a request in flight when it began included; net/http
// then closes the connection after the answer.
type closingWriter struct {
	http.ResponseWriter
	drain  *drain
	marked bool
}

func (w *closingWriter) mark() {
	if !w.marked {
		w.marked = true
		if w.drain.closing.Load() {
			w.Header().Set("Connection", "close")
		}
	}
}

func (w *closingWriter) WriteHeader(status int) {
	w.mark()
	w.ResponseWriter.WriteHeader(status)
}

func (w *closingWriter) Write(p []byte) (int, error) {
	w.mark()
	return w.ResponseWriter.Write(p)
}

// Flush lets a handler stream through the wrapper (http.Flusher).
func (w *closingWriter) Flush() {
	w.mark()
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

// Unwrap gives http.ResponseController the writer underneath.
func (w *closingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// wait returns when no connection is open, or when ctx is done.
func (d *drain) wait(ctx context.Context) {
	for {
		d.mu.Lock()
		open, changed := d.open, d.changed
		d.mu.Unlock()
		if open == 0 {
			return
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return
		}
	}
}
