package store

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/yourorg/orders/internal/domain"
	"github.com/yourorg/orders/internal/store/dbsqlc"
)

// DBTX is what every store function runs its SQL on: a *pgxpool.Pool, a
// *pgx.Conn or a pgx.Tx.
type DBTX = dbsqlc.DBTX

var queries = dbsqlc.New()

// PoolConfig configures the connection pool of a process.
type PoolConfig struct {
	// URL is the PostgreSQL connection string (DATABASE_URL).
	URL string
	// MaxConns caps the pool; 0 keeps pgxpool's default (max(4, CPUs)).
	MaxConns int32
	// AppName is shown in pg_stat_activity.application_name.
	AppName string
	// ConnectTimeout bounds the wait for the database at start. Default 30s.
	ConnectTimeout time.Duration
	// Tracer, when set, instruments every query (see internal/telemetry).
	Tracer pgx.QueryTracer
	// StatementTimeout and LockTimeout bound every statement of the pool's
	// sessions, and its waits for locks (0: no limit). A statement cut
	// short fails with SQLSTATE 57014 or 55P03, both transient.
	StatementTimeout, LockTimeout time.Duration
	// AsyncCommit turns synchronous_commit off for the pool's sessions: a
	// commit returns before its WAL is flushed, and a database crash may
	// forget the last few hundred milliseconds of commits. Only for work
	// that is safe to lose and redo: the relay's claims and marks (a lost
	// one means a message is published again, which consumers absorb),
	// never for business writes.
	AsyncCommit bool
}

// NewPool opens a pool and waits until the database answers, so that a
// process started next to its database (docker compose) does not fail at
// once. It gives up after cfg.ConnectTimeout.
func NewPool(ctx context.Context, cfg PoolConfig) (*pgxpool.Pool, error) {
	pcfg, err := pgxpool.ParseConfig(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("parse DATABASE_URL: %w", err)
	}
	if cfg.MaxConns > 0 {
		pcfg.MaxConns = cfg.MaxConns
	}
	if cfg.AppName != "" {
		pcfg.ConnConfig.RuntimeParams["application_name"] = cfg.AppName
	}
	if cfg.Tracer != nil {
		pcfg.ConnConfig.Tracer = cfg.Tracer
	}
	if cfg.StatementTimeout > 0 {
		pcfg.ConnConfig.RuntimeParams["statement_timeout"] = strconv.FormatInt(cfg.StatementTimeout.Milliseconds(), 10)
	}
	if cfg.LockTimeout > 0 {
		pcfg.ConnConfig.RuntimeParams["lock_timeout"] = strconv.FormatInt(cfg.LockTimeout.Milliseconds(), 10)
	}
	if cfg.AsyncCommit {
		pcfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("create pool: %w", err)
	}
	if err := waitForDatabase(ctx, pool, cmp.Or(cfg.ConnectTimeout, 30*time.Second)); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

// waitForDatabase pings the database until it answers, for at most
// timeout: a server that is still starting, or not listening yet, is
// waited for. A refusal that no wait can change is returned at once, with
// its cause: a wrong password (SQLSTATE 28P01), a role that does not
// exist or may not log in from here (28000), a database that does not
// exist (3D000).
func waitForDatabase(ctx context.Context, pool *pgxpool.Pool, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	delay := 100 * time.Millisecond
	for {
		err := pool.Ping(ctx)
		if err == nil {
			return nil
		}
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) {
			cause := map[string]string{
				"28P01": "the password is wrong",
				"28000": "the role does not exist or may not log in from here (pg_hba.conf)",
				"3D000": "the database does not exist (migrate creates it)",
			}[pgErr.Code]
			if cause != "" {
				return fmt.Errorf("database refused the connection, not retried: %s (SQLSTATE %s): %w", cause, pgErr.Code, err)
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("database not reachable after %s: %w", timeout, err)
		case <-time.After(delay):
			delay = min(2*delay, 2*time.Second)
		}
	}
}

// Translate maps driver errors to the domain's sentinel errors, keeping the
// original in the chain for logs.
func Translate(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("%w: %w", domain.ErrNotFound, err)
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" {
		return fmt.Errorf("%w: %s: %w", domain.ErrConflict, pgErr.ConstraintName, err)
	}
	return err
}

// TransientCode names a transient database failure with a short code
// (lock_timeout, statement_timeout, serialization_failure, deadlock,
// database_read_only, database_unavailable), or returns "" when err is not
// transient.
func TransientCode(err error) string {
	if !IsTransient(err) {
		return ""
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "25006":
			return "database_read_only"
		case "55P03":
			return "lock_timeout"
		case "57014":
			return "statement_timeout"
		case "40001":
			return "serialization_failure"
		case "40P01":
			return "deadlock"
		}
	}
	return "database_unavailable"
}

// IsTransient reports whether err is worth retrying later as it is: the
// database went away, was too busy, or picked this transaction as the loser
// of a serialization failure, a deadlock or a lock or statement timeout.
// Constraint violations, bad SQL and missing rows are not transient.
func IsTransient(err error) bool {
	if err == nil {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "40001", // serialization_failure
			"40P01", // deadlock_detected
			"25006", // read_only_sql_transaction (a standby, or a read-only database)
			"55P03", // lock_not_available (lock_timeout)
			"57014", // query_canceled (statement_timeout)
			"53100", // disk_full
			"53200", // out_of_memory
			"53300", // too_many_connections
			"57P01", // admin_shutdown
			"57P02", // crash_shutdown
			"57P03": // cannot_connect_now
			return true
		}
		return pgErr.Code[:2] == "08" // connection_exception class
	}
	if errors.Is(err, context.DeadlineExceeded) || pgconn.SafeToRetry(err) || pgconn.Timeout(err) {
		return true
	}
	var netErr net.Error
	if errors.As(err, &netErr) {
		return true
	}
	var connErr *pgconn.ConnectError
	return errors.As(err, &connErr) || errors.Is(err, pgx.ErrTxClosed) || isClosedConn(err)
}

func isClosedConn(err error) bool {
	// pgx reports a connection that died under a query as "conn closed" or
	// an unexpected EOF; both mean the statement may be run again.
	msg := err.Error()
	for _, sign := range []string{"conn closed", "unexpected EOF", "connection reset", "broken pipe"} {
		if strings.Contains(msg, sign) {
			return true
		}
	}
	return false
}

// IsUnavailable reports whether err says that the database cannot do any
// work right now, whatever the work: the connection failed, was cut or
// timed out; the server is shutting down or starting; it refuses more
// connections; it is out of disk or memory; it is a read-only standby (a
// failover in progress) or read-only. The same work, unchanged, can succeed
// later; nothing about the message or the request is wrong. Contention
// (deadlocks, serialization failures, lock and statement timeouts) is
// transient but not unavailability: it is about the rows this work touches.
func IsUnavailable(err error) bool {
	if err == nil || !IsTransient(err) {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "40001", "40P01", "55P03", "57014":
			return false
		}
	}
	return true
}
