package database_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/yourorg/orders/migrations"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/testenv"
)

// The pool's timeouts and synchronous_commit hold in every transaction Run
// runs and every statement RunStatement runs, straight to the server and
// through PgBouncer: a lock wait beyond the lock timeout fails with 55P03,
// a statement beyond the statement timeout with 57014, and the commit is
// asynchronous. Straight to the server they are the sessions' own (startup
// parameters); through the pooler, which refuses those at connect, each
// transaction sets them, and outside one the session keeps the server's.
func TestSettingsHoldInEveryTransaction(t *testing.T) {
	t.Parallel()
	db := testenv.NewDatabase(t, migrations.Schemas...)
	ctx := t.Context()
	if _, err := db.Pool.Exec(ctx, "CREATE TABLE locked (id int PRIMARY KEY); INSERT INTO locked VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	pooler := testenv.NewPgBouncer(t, db.URL)
	for _, via := range []struct {
		name, url string
		pooled    bool
	}{{"straight", db.URL, false}, {"pgbouncer", pooler.URL(db.URL), true}} {
		t.Run(via.name, func(t *testing.T) {
			pool, err := database.NewPool(ctx, database.PoolConfig{URL: via.url, AppName: "settings",
				StatementTimeout: time.Second, LockTimeout: 200 * time.Millisecond, AsyncCommit: true})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			for _, name := range []string{"statement_timeout", "lock_timeout", "synchronous_commit"} {
				if _, ok := pool.Config().ConnConfig.RuntimeParams[name]; ok == via.pooled {
					t.Errorf("startup parameter %s: %v, want %v", name, ok, !via.pooled)
				}
			}
			run := func(p database.Policy, sql string) (string, error) {
				var v string
				err := database.Run(ctx, pool, p, func(ctx context.Context, tx pgx.Tx) error {
					return tx.QueryRow(ctx, sql).Scan(&v)
				})
				return v, err
			}
			statement := func(sql string) (string, error) {
				var v string
				err := database.RunStatement(ctx, pool, func(ctx context.Context, db database.DBTX) error {
					return db.QueryRow(ctx, sql).Scan(&v)
				})
				return v, err
			}
			code := func(err error) string {
				var pgErr *pgconn.PgError
				if errors.As(err, &pgErr) {
					return pgErr.Code
				}
				return ""
			}

			holder, err := db.Pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = holder.Rollback(ctx) }()
			if _, err := holder.Exec(ctx, "SELECT FROM locked WHERE id = 1 FOR UPDATE"); err != nil {
				t.Fatal(err)
			}
			for _, p := range []database.Policy{{}, {Options: pgx.TxOptions{IsoLevel: pgx.Serializable, AccessMode: pgx.ReadWrite}}} {
				start := time.Now()
				_, err := run(p, "UPDATE locked SET id = 1 WHERE id = 1 RETURNING ''")
				if code(err) != "55P03" || time.Since(start) > 5*time.Second {
					t.Errorf("%+v: a lock wait ended after %s with %v, want 55P03 after the lock timeout", p.Options, time.Since(start), err)
				}
			}
			if _, err := statement("UPDATE locked SET id = 1 WHERE id = 1 RETURNING ''"); code(err) != "55P03" {
				t.Errorf("RunStatement: a lock wait ended with %v, want 55P03", err)
			}
			_ = holder.Rollback(ctx)

			if _, err := run(database.Policy{}, "SELECT pg_sleep(3)::text"); code(err) != "57014" {
				t.Errorf("a 3 s statement: %v, want 57014", err)
			}
			if _, err := statement("SELECT pg_sleep(3)::text"); code(err) != "57014" {
				t.Errorf("RunStatement: a 3 s statement: %v, want 57014", err)
			}
			if v, err := run(database.Policy{ConfirmCommit: true}, "SHOW synchronous_commit"); err != nil || v != "off" {
				t.Errorf("synchronous_commit in a transaction: %q, %v; want off", v, err)
			}
			if v, err := statement("SHOW synchronous_commit"); err != nil || v != "off" {
				t.Errorf("synchronous_commit in RunStatement: %q, %v; want off", v, err)
			}
			want := "200ms" // the session's own
			if via.pooled {
				want = "0" // the server's: a session the pooler lends is left as it was
			}
			var v string
			if err := pool.QueryRow(ctx, "SHOW lock_timeout").Scan(&v); err != nil || v != want {
				t.Errorf("lock_timeout outside a transaction: %q, %v; want %s", v, err, want)
			}
		})
	}
}

// Straight to the server, a pool NewPool made uses pgx's statement cache,
// the fastest mode (BenchmarkQueryExecMode): named prepared statements on
// its sessions. Through a pooler it names none (TestThroughPgBouncer, where
// pgx's default mode fails at once with 42P05).
func TestStraightToTheServerStatementsArePrepared(t *testing.T) {
	t.Parallel()
	db := testenv.NewDatabase(t, migrations.Schemas...)
	ctx := t.Context()
	pool, err := database.NewPool(ctx, database.PoolConfig{URL: db.URL, MaxConns: 1, AppName: "prepared"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	err = database.Run(ctx, pool, database.Policy{ConfirmCommit: true}, func(ctx context.Context, tx pgx.Tx) error {
		var n int
		return tx.QueryRow(ctx, "SELECT $1::int", 1).Scan(&n)
	})
	if err != nil {
		t.Fatal(err)
	}
	var named int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_prepared_statements").Scan(&named); err != nil || named == 0 {
		t.Fatalf("%d prepared statements (%v), want the statement cache's", named, err)
	}
}

// Through PgBouncer in transaction mode with its default settings, a pool
// NewPool made with every setting connects (the pooler refuses unknown
// startup parameters), its transactions run side by side on whichever
// server sessions the pooler lends them (no named prepared statement to
// miss: pgx's default mode fails here at once with 42P05), and its lock
// timeout holds in them.
func TestThroughPgBouncer(t *testing.T) {
	t.Parallel()
	db := testenv.NewDatabase(t, migrations.Schemas...)
	ctx := t.Context()
	if _, err := db.Pool.Exec(ctx, "CREATE TABLE counted (id int PRIMARY KEY, n int NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	pooler := testenv.NewPgBouncer(t, db.URL)
	pool, err := database.NewPool(ctx, database.PoolConfig{URL: pooler.URL(db.URL), AppName: "pooled", MaxConns: 8,
		StatementTimeout: 5 * time.Second, LockTimeout: 200 * time.Millisecond, AsyncCommit: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	const workers, each = 8, 50
	errs := make(chan error, workers)
	for w := range workers {
		go func() {
			for i := range each {
				id := w*each + i
				err := database.Run(ctx, pool, database.Policy{ConfirmCommit: true}, func(ctx context.Context, tx pgx.Tx) error {
					if _, err := tx.Exec(ctx, "INSERT INTO counted (id, n) VALUES ($1, $2)", id, i); err != nil {
						return err
					}
					var n int
					return tx.QueryRow(ctx, "SELECT n FROM counted WHERE id = $1", id).Scan(&n)
				})
				if err == nil {
					var n int
					err = pool.QueryRow(ctx, "SELECT count(*) FROM counted WHERE id <= $1", id).Scan(&n)
				}
				if err != nil {
					errs <- fmt.Errorf("row %d: %w", id, err)
					return
				}
			}
			errs <- nil
		}()
	}
	for range workers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}

	holder, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Rollback(ctx) }()
	if _, err := holder.Exec(ctx, "SELECT FROM counted WHERE id = 0 FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	err = database.Run(ctx, pool, database.Policy{}, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "UPDATE counted SET n = n + 1 WHERE id = $1", 0)
		return err
	})
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "55P03" {
		t.Errorf("a lock wait through the pooler: %v, want 55P03", err)
	}
}
