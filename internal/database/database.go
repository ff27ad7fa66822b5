package database

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DBTX is what SQL runs on: a *pgxpool.Pool, a *pgx.Conn or a pgx.Tx. The
// interface sqlc generates for each query package has the same methods, so
// a DBTX can be passed to any of them.
type DBTX interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

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
	// Tracer, when set, instruments every query.
	Tracer pgx.QueryTracer
	// StatementTimeout and LockTimeout bound every statement, and its waits
	// for locks (0: no limit); behind a pooler, those of the transactions
	// Run runs and of RunStatement. A statement cut short fails with
	// SQLSTATE 57014 or 55P03, both transient.
	StatementTimeout, LockTimeout time.Duration
	// AsyncCommit turns synchronous_commit off for the pool's commits
	// (behind a pooler, those of Run and RunStatement): a commit returns
	// before its WAL is flushed, and a database crash may forget the last
	// few hundred milliseconds of commits. Only for work that is safe to lose and redo: the relay's
	// claims and marks (a lost one means a message is published again,
	// which consumers absorb), never for business writes.
	AsyncCommit bool
}

// settings is what a transaction of the pool sets for itself (SET LOCAL)
// behind a pooler, "" for none. They cannot be startup parameters there:
// a pooler in transaction mode (PgBouncer) refuses those it does not
// know, and hands each transaction whichever server session is free, so
// only a setting a transaction makes itself holds for it.
func (cfg PoolConfig) settings() string {
	var set []string
	if cfg.StatementTimeout > 0 {
		set = append(set, fmt.Sprintf("SET LOCAL statement_timeout = %d", cfg.StatementTimeout.Milliseconds()))
	}
	if cfg.LockTimeout > 0 {
		set = append(set, fmt.Sprintf("SET LOCAL lock_timeout = %d", cfg.LockTimeout.Milliseconds()))
	}
	if cfg.AsyncCommit {
		set = append(set, "SET LOCAL synchronous_commit = off")
	}
	return strings.Join(set, "; ")
}

// startupParams are the pool's settings as its sessions' own, for a pool
// straight to the server.
func (cfg PoolConfig) startupParams() map[string]string {
	params := map[string]string{}
	if cfg.StatementTimeout > 0 {
		params["statement_timeout"] = strconv.FormatInt(cfg.StatementTimeout.Milliseconds(), 10)
	}
	if cfg.LockTimeout > 0 {
		params["lock_timeout"] = strconv.FormatInt(cfg.LockTimeout.Milliseconds(), 10)
	}
	if cfg.AsyncCommit {
		params["synchronous_commit"] = "off"
	}
	return params
}

// settingsKey is where a connection of a pool NewPool made keeps the
// pool's settings (pgconn's CustomData), for Run's BEGIN.
const settingsKey = "database.settings"

// NewPool opens a pool and waits until the database answers, so that a
// process started next to its database (docker compose) does not fail at
// once. It gives up after cfg.ConnectTimeout, and at once when the server
// refuses the login or has no such database: waiting cannot mend those.
//
// It adapts to what it finds between it and the server. Behind a pooler
// in transaction mode (PgBouncer; ThroughPooler), its connections send no
// startup parameter but the application name, each transaction sets the
// pool's settings itself (settings), and unless the URL says otherwise
// (default_query_exec_mode) statements run in pgx's cache_describe mode,
// one round trip on the unnamed statement: pgx's default mode keeps named
// prepared statements on the server session that prepared them, while a
// pooler hands the next transaction another. Straight to the server, the
// settings are the sessions' own (startup parameters) and statements use
// pgx's statement cache, the fastest (BenchmarkQueryExecMode measures the
// two): what cannot work behind a pooler is used only where there is none.
func NewPool(ctx context.Context, cfg PoolConfig) (*pgxpool.Pool, error) {
	pool, err := newPool(ctx, cfg, true)
	if err != nil {
		return nil, err
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect: %w", err)
	}
	pooled, err := ThroughPooler(ctx, conn.Conn())
	conn.Release()
	if err != nil || pooled { // on an error, what works everywhere
		return pool, nil
	}
	pool.Close()
	return newPool(ctx, cfg, false)
}

// newPool opens a pool of cfg, its settings made per transaction
// (pooled) or by its sessions, and waits for the database.
func newPool(ctx context.Context, cfg PoolConfig, pooled bool) (*pgxpool.Pool, error) {
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
	switch set := cfg.settings(); {
	case !pooled:
		maps.Copy(pcfg.ConnConfig.RuntimeParams, cfg.startupParams())
	case set != "":
		if !strings.Contains(cfg.URL, "default_query_exec_mode") {
			pcfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
		}
		pcfg.AfterConnect = func(_ context.Context, conn *pgx.Conn) error {
			conn.PgConn().CustomData()[settingsKey] = set
			return nil
		}
	default:
		if !strings.Contains(cfg.URL, "default_query_exec_mode") {
			pcfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
		}
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

// RunStatement runs fn, the work of one statement, with the pool's
// settings in force: on a connection of the pool when its session carries
// them (no pooler between), one round trip; else in a transaction that
// sets them (Run, with no policy but ctx).
func RunStatement(ctx context.Context, pool *pgxpool.Pool, fn func(ctx context.Context, db DBTX) error) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return Fault(err)
	}
	if set, _ := conn.Conn().PgConn().CustomData()[settingsKey].(string); set == "" {
		defer conn.Release()
		return Fault(fn(ctx, conn.Conn()))
	}
	conn.Release()
	return Run(ctx, pool, Policy{}, func(ctx context.Context, tx pgx.Tx) error { return fn(ctx, tx) })
}

func waitForDatabase(ctx context.Context, pool *pgxpool.Pool, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	delay := 100 * time.Millisecond
	for {
		err := pool.Ping(ctx)
		if err == nil {
			return nil
		}
		if cause := refusal(err); cause != "" {
			return fmt.Errorf("database refused the connection, not retried: %s: %w", cause, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("database not reachable after %s: %w", timeout, err)
		case <-time.After(delay):
			delay = min(2*delay, 2*time.Second)
		}
	}
}

// refusal names the cause when the server refused a connection for a
// reason that waiting does not mend, and is "" otherwise.
func refusal(err error) string {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return ""
	}
	switch pgErr.Code {
	case "28P01":
		return "the password is wrong (SQLSTATE 28P01)"
	case "28000":
		return "the role does not exist or may not log in from here, see pg_hba.conf (SQLSTATE 28000)"
	case "3D000":
		return "the database does not exist, migrate creates it (SQLSTATE 3D000)"
	}
	return ""
}

// ThroughPooler reports whether conn reaches its server through a
// connection pooler (PgBouncer), whose sessions are lent per transaction:
// the server process conn's statements run in is not the one the server
// named at connect, which a pooler makes up. A connection that LISTENs or
// streams the log must reach the server itself.
func ThroughPooler(ctx context.Context, conn *pgx.Conn) (bool, error) {
	var pid uint32
	if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		return false, fmt.Errorf("ask for the server process: %w", err)
	}
	return pid != conn.PgConn().PID(), nil
}

// NilIfEmpty turns "" into SQL NULL for a nullable text column.
func NilIfEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// Deref reads a nullable text column, NULL as "".
func Deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
