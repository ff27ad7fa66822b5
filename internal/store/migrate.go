package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	goosedb "github.com/pressly/goose/v3/database"
	"github.com/pressly/goose/v3/lock"

	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/messaging/inbox"
	"github.com/yourorg/orders/internal/messaging/outbox"
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

// connectRetrying connects with cfg, trying again until ctx is done. Its
// error names the wait it was given (ctx's deadline), not the time the last
// attempt happened to end at, so a 1s DB_CONNECT_TIMEOUT reads as 1s.
func connectRetrying(ctx context.Context, cfg *pgx.ConnConfig) (*pgx.Conn, error) {
	start := time.Now()
	waited := func() time.Duration {
		if deadline, ok := ctx.Deadline(); ok {
			return deadline.Sub(start).Round(100 * time.Millisecond)
		}
		return time.Since(start).Round(100 * time.Millisecond)
	}
	delay := 100 * time.Millisecond
	for {
		conn, err := pgx.ConnectConfig(ctx, cfg)
		if err == nil {
			return conn, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("PostgreSQL at %s not reachable: gave up after %s: %w",
				net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))), waited(), err)
		case <-time.After(delay):
			delay = min(2*delay, 2*time.Second)
		}
	}
}

// Migrator applies the order service's database (migrations.Schemas): the
// outbox's and the inbox's migrations, then the service's.
type Migrator struct {
	*database.Migrator
	pool *pgxpool.Pool
}

// NewMigrator prepares a migrator on pool. Close it when done.
func NewMigrator(pool *pgxpool.Pool, logger *slog.Logger) (*Migrator, error) {
	m, err := database.NewMigrator(pool, logger, migrations.Schemas...)
	if err != nil {
		return nil, err
	}
	return &Migrator{Migrator: m, pool: pool}, nil
}

// Up applies every pending migration, after recording the mechanisms'
// versions that a database migrated before they had their own already has
// (adopted).
func (m *Migrator) Up(ctx context.Context) error {
	if err := adoptMechanismVersions(ctx, m.pool); err != nil {
		return fmt.Errorf("migrate up: %w", err)
	}
	return m.Migrator.Up(ctx)
}

// adopted maps each mechanism's versions to those of the service's
// sequence (migrations/) that did the same before the mechanisms had
// migrations of their own, when the service's versions 2, 3, 11, 14 and 15
// made the outbox's and the inbox's tables.
var adopted = []struct {
	schema database.Schema
	from   map[int64]int64 // the mechanism's version: the service's
}{
	{outbox.Schema, map[int64]int64{1: 2, 2: 11, 3: 14, 4: 15}},
	{inbox.Schema, map[int64]int64{1: 3}},
}

// adoptMechanismVersions runs before the mechanisms' migrations. On a
// database whose service sequence made their tables (adopted), a mechanism
// without a version table yet gets one, recording as applied each of its
// versions whose counterpart the service's table records: none runs twice,
// and its later ones run as on any database. On a new database, or once
// the mechanisms have their tables, it does nothing. It holds goose's
// advisory lock, so that replicas migrating together adopt once.
func adoptMechanismVersions(ctx context.Context, pool *pgxpool.Pool) error {
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, "SELECT pg_advisory_xact_lock($1)", lock.DefaultLockID); err != nil {
		return fmt.Errorf("migration lock: %w", err)
	}
	exists := func(table string) (bool, error) {
		var ok bool
		err := tx.QueryRowContext(ctx, "SELECT to_regclass($1) IS NOT NULL", table).Scan(&ok)
		return ok, err
	}
	if service, err := exists(migrations.Schema.VersionTable); err != nil || !service {
		return err // a new database
	}
	for _, a := range adopted {
		own, err := exists(a.schema.VersionTable)
		if err != nil {
			return err
		}
		if own {
			continue
		}
		var versions []int64
		for _, v := range slices.Sorted(maps.Keys(a.from)) {
			var applied bool
			err := tx.QueryRowContext(ctx, "SELECT EXISTS (SELECT 1 FROM "+migrations.Schema.VersionTable+
				" WHERE version_id = $1 AND is_applied)", a.from[v]).Scan(&applied)
			if err != nil {
				return err
			}
			if applied {
				versions = append(versions, v)
			}
		}
		if len(versions) == 0 {
			continue
		}
		// The table as goose makes it, with its version 0.
		table, err := goosedb.NewStore(goosedb.DialectPostgres, a.schema.VersionTable)
		if err != nil {
			return err
		}
		if err := table.CreateVersionTable(ctx, tx); err != nil {
			return fmt.Errorf("create %s: %w", a.schema.VersionTable, err)
		}
		for _, v := range append([]int64{0}, versions...) {
			if err := table.Insert(ctx, tx, goosedb.InsertRequest{Version: v}); err != nil {
				return fmt.Errorf("record version %d of %s: %w", v, a.schema.Name, err)
			}
		}
	}
	return tx.Commit()
}

// RelayWALRole runs after the migrations, at every migrate up, since the
// relay's mode may change after they are all applied. With want
// (MIGRATE_RELAY_WAL_ROLE), it makes migrations.RoleRelayWAL, the
// log-tailing relay's replication role, with REPLICATION, unless it has it
// already. Only a superuser may: otherwise it logs the statement for one to
// run, as it does when orders_relay still has REPLICATION (which
// 00019_relay_no_replication.sql takes away only as a superuser). Without
// want it changes nothing: the role, if any, belongs to the whole server,
// and another database of it may stream as it.
func RelayWALRole(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger, want bool) error {
	for try := 1; ; try++ {
		err := relayWALRole(ctx, pool, logger, want)
		var pgErr *pgconn.PgError
		if try < 5 && errors.As(err, &pgErr) && (pgErr.Code == "42710" || pgErr.Code == "XX000") {
			// Another database's migrate made or changed the role at the
			// same moment (duplicate_object, "tuple concurrently
			// updated"): look again.
			continue
		}
		return err
	}
}

func relayWALRole(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger, want bool) error {
	const look = `SELECT (SELECT rolsuper FROM pg_roles WHERE rolname = current_user),
	       coalesce((SELECT rolreplication FROM pg_roles WHERE rolname = $1), false),
	       EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $2),
	       coalesce((SELECT rolreplication FROM pg_roles WHERE rolname = $2), false)`
	var super, relayReplicates, exists, replicates bool
	if err := pool.QueryRow(ctx, look, migrations.RoleRelay, migrations.RoleRelayWAL).Scan(&super, &relayReplicates, &exists, &replicates); err != nil {
		return fmt.Errorf("look at the relays' roles: %w", err)
	}
	if relayReplicates && !super {
		logger.WarnContext(ctx, "orders_relay has REPLICATION, which lets it read every table: a superuser runs ALTER ROLE orders_relay NOREPLICATION")
	}
	if !want || replicates {
		return nil
	}
	statement := "CREATE ROLE " + migrations.RoleRelayWAL + " LOGIN REPLICATION"
	if exists {
		statement = "ALTER ROLE " + migrations.RoleRelayWAL + " WITH REPLICATION"
	}
	if !super {
		logger.WarnContext(ctx, "MIGRATE_RELAY_WAL_ROLE: only a superuser may give a role REPLICATION; one runs "+statement+
			" (and sets its password)", slog.String("role", migrations.RoleRelayWAL))
		return nil
	}
	if _, err := pool.Exec(ctx, statement); err != nil {
		return fmt.Errorf("the log-tailing relay's role: %s: %w", statement, err)
	}
	logger.InfoContext(ctx, "replication role made for RELAY_MODE=wal", slog.String("role", migrations.RoleRelayWAL))
	return nil
}
