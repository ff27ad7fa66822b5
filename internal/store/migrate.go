package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/yourorg/orders/migrations"
)

// EnsureDatabase creates the database named in url if the server does not
// have it yet (a fresh server has only its maintenance databases). Two
// processes racing to create it are fine: the loser sees it exist.
//
// A server that refuses connections, or answers that it is starting up, is
// tried again with a growing delay until ctx is done: give ctx the deadline
// start-up may take (migrate uses DB_CONNECT_TIMEOUT).
func EnsureDatabase(ctx context.Context, url string) error {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return fmt.Errorf("parse DATABASE_URL: %w", err)
	}
	name := cfg.Database
	if name == "" || name == "postgres" {
		return nil
	}
	cfg.Database = "postgres"
	conn, err := connectRetrying(ctx, cfg)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))

	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists); err != nil {
		return fmt.Errorf("look up database %q: %w", name, err)
	}
	if exists {
		return nil
	}
	_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P04" { // duplicate_database: another process won
		return nil
	}
	if err != nil {
		return fmt.Errorf("create database %q: %w", name, err)
	}
	return nil
}

// connectRetrying connects with cfg, trying again until ctx is done.
func connectRetrying(ctx context.Context, cfg *pgx.ConnConfig) (*pgx.Conn, error) {
	start := time.Now()
	delay := 100 * time.Millisecond
	for {
		conn, err := pgx.ConnectConfig(ctx, cfg)
		if err == nil {
			return conn, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("PostgreSQL at %s not reachable: gave up after %s: %w",
				net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))), time.Since(start).Round(100*time.Millisecond), err)
		case <-time.After(delay):
			delay = min(2*delay, 2*time.Second)
		}
	}
}

// Migrator applies the embedded migrations (package migrations) under
// goose's PostgreSQL advisory lock, so that replicas starting together with
// MIGRATE_ON_START=true apply each migration once.
type Migrator struct {
	provider *goose.Provider
	db       *sql.DB
	logger   *slog.Logger
}

// NewMigrator prepares a migrator on pool. Close it when done.
func NewMigrator(pool *pgxpool.Pool, logger *slog.Logger) (*Migrator, error) {
	locker, err := lock.NewPostgresSessionLocker()
	if err != nil {
		return nil, fmt.Errorf("migration lock: %w", err)
	}
	db := stdlib.OpenDBFromPool(pool)
	provider, err := goose.NewProvider(goose.DialectPostgres, db, migrations.FS,
		goose.WithSessionLocker(locker))
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("load migrations: %w", err)
	}
	return &Migrator{provider: provider, db: db, logger: logger}, nil
}

// Up applies every pending migration.
func (m *Migrator) Up(ctx context.Context) error {
	results, err := m.provider.Up(ctx)
	m.log(results)
	if err != nil {
		return fmt.Errorf("migrate up: %w", err)
	}
	if len(results) == 0 {
		m.logger.InfoContext(ctx, "schema is up to date")
	}
	return nil
}

// Down rolls back the latest migration.
func (m *Migrator) Down(ctx context.Context) error {
	result, err := m.provider.Down(ctx)
	if result != nil {
		m.log([]*goose.MigrationResult{result})
	}
	if err != nil {
		return fmt.Errorf("migrate down: %w", err)
	}
	return nil
}

// DownTo rolls back every migration newer than version (0: all of them).
func (m *Migrator) DownTo(ctx context.Context, version int64) error {
	results, err := m.provider.DownTo(ctx, version)
	m.log(results)
	if err != nil {
		return fmt.Errorf("migrate down to %d: %w", version, err)
	}
	return nil
}

// Status writes one line per migration: applied or pending.
func (m *Migrator) Status(ctx context.Context, w io.Writer) error {
	statuses, err := m.provider.Status(ctx)
	if err != nil {
		return fmt.Errorf("migration status: %w", err)
	}
	for _, s := range statuses {
		applied := "pending"
		if s.State == goose.StateApplied {
			applied = "applied " + s.AppliedAt.Format("2006-01-02 15:04:05")
		}
		if _, err := fmt.Fprintf(w, "%-40s %s\n", s.Source.Path, applied); err != nil {
			return err
		}
	}
	return nil
}

// Close releases the migrator's database handle (not the pool).
func (m *Migrator) Close() error { return m.db.Close() }

func (m *Migrator) log(results []*goose.MigrationResult) {
	for _, r := range results {
		m.logger.Info("migration applied",
			slog.String("migration", r.Source.Path),
			slog.String("direction", r.Direction),
			slog.Duration("took", r.Duration))
	}
}
