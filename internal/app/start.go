package app

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"github.com/yourorg/orders/internal/config"
	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/telemetry"
)

// Process is a service binary once started: its command line, its
// telemetry and logger, and its database settings.
type Process struct {
	Args Args
	Tel  *telemetry.Telemetry
	Log  *slog.Logger
	db   config.Database
}

// Start is how every service binary begins, before its own part (serve):
//
//	configuration   cfg from the environment (environ in tests), validated
//	command line    -migrate, migrate, and the binary's own commands
//	healthcheck     with a cfg that is a Readiness: GET its /readyz, and end
//	telemetry       logs, traces and metrics, shut down (flushed) on return
//	migrate         the migrate command runs here, and the process ends
//
// then it logs the effective configuration (secrets masked) and runs
// serve, which gets the other commands in p.Args.Command.
func Start(ctx context.Context, service string, cfg config.Service, args []string, environ map[string]string,
	stdout, stderr io.Writer, commands []string, serve func(ctx context.Context, p *Process) error,
) error {
	if err := config.Load(cfg, environ); err != nil {
		return err
	}
	r, probed := cfg.(Readiness)
	if probed {
		commands = append(slices.Clone(commands), HealthcheckCommand)
	}
	cli, err := ParseArgs(service, args, stderr, commands...)
	if err != nil {
		return err
	}
	// Before telemetry: a health check runs every few seconds, and is no
	// process of its own to trace or to log about.
	if probed && len(cli.Command) > 0 && cli.Command[0] == "healthcheck" {
		return Healthcheck(ctx, r.ReadyzAddr(), "/readyz", stdout)
	}
	tel, err := telemetry.Setup(ctx, service, cfg.TelemetryBlock(), cfg.LogBlock(), stdout)
	if err != nil {
		return fmt.Errorf("telemetry: %w", err)
	}
	defer func() { _ = tel.Shutdown(context.WithoutCancel(ctx)) }()
	p := &Process{Args: cli, Tel: tel, Log: tel.Logger, db: cfg.DatabaseBlock()}
	if len(cli.Command) > 0 {
		if cli.Command[0] == "migrate" {
			return RunMigrate(ctx, p.db, cli.Command[1:], p.Log, stdout)
		}
		return serve(ctx, p) // a command of the binary's own
	}
	p.Log.InfoContext(ctx, "starting", config.LogAttrs(cfg)...)
	config.WarnDevelopment(ctx, p.Log, cfg)
	err = serve(ctx, p)
	p.Log.InfoContext(ctx, "stopped", slog.Any("error", err))
	return err
}

// OpenDatabase opens the process's pool (OpenDatabase with its settings,
// its -migrate flag and its telemetry).
func (p *Process) OpenDatabase(ctx context.Context, pc database.PoolConfig) (*pgxpool.Pool, error) {
	return OpenDatabase(ctx, pc, p.db, p.Args.Migrate, p.Tel)
}

// RunWithAdmin runs work and the admin endpoints (admin, on addr) until
// ctx ends or either fails; then both stop.
func (p *Process) RunWithAdmin(ctx context.Context, addr string, admin http.Handler, work func(context.Context) error) error {
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return work(gctx) })
	g.Go(func() error { return Serve(gctx, NewHTTPServer(addr, admin, p.Log), 5*time.Second, p.Log, nil) })
	return g.Wait()
}
