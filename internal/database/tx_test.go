package database_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/yourorg/orders/migrations"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/testenv"
)

type testBundle struct {
	db    *testenv.Database
	pool  *pgxpool.Pool  // Run's, through proxy
	proxy *testenv.Proxy // between pool and the server
}

// setup makes a database with a table runs(id), whose COMMITs sleep as
// long as the transaction's setting test.commit_sleep says (a deferred
// trigger), and a pool to it through a proxy.
func setup(t *testing.T) testBundle {
	t.Helper()
	db := testenv.NewDatabase(t, migrations.Schemas...)
	if _, err := db.Pool.Exec(t.Context(), `
		CREATE TABLE runs (id int PRIMARY KEY, n int NOT NULL DEFAULT 0);
		CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
			PERFORM pg_sleep(coalesce(nullif(current_setting('test.commit_sleep', true), ''), '0')::float); RETURN NULL; END $$;
		CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON runs DEFERRABLE INITIALLY DEFERRED
			FOR EACH ROW EXECUTE FUNCTION slow_commit();`); err != nil {
		t.Fatal(err)
	}
	proxy := testenv.NewProxy(t, testenv.HostPort(db.URL))
	pool, err := pgxpool.New(t.Context(), proxy.Rewrite(db.URL))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return testBundle{db: db, pool: pool, proxy: proxy}
}

func (b testBundle) count(t *testing.T) int {
	t.Helper()
	var n int
	if err := b.db.Pool.QueryRow(t.Context(), "SELECT count(*) FROM runs").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// whileCommitting calls cut once session pid has run its COMMIT for a
// tenth of a second: the id Run asks for with the COMMIT has crossed the
// proxy by then.
func (b testBundle) whileCommitting(t *testing.T, pid *atomic.Int32, cut func(pid int32)) {
	t.Helper()
	testenv.WaitFor(t, 10*time.Second, "the COMMIT", func() bool {
		var n int
		err := b.db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity
			WHERE pid = $1 AND state = 'active' AND lower(query) = 'commit'
			AND query_start < now() - interval '100 ms'`, pid.Load()).Scan(&n)
		return err == nil && n == 1
	})
	cut(pid.Load())
}

func terminate(t *testing.T, b testBundle, pid int32) {
	t.Helper()
	if _, err := b.db.Pool.Exec(t.Context(), "SELECT pg_terminate_backend($1)", pid); err != nil {
		t.Fatal(err)
	}
}

// insert is a transaction that writes row 1 and records its session's pid
// and the number of runs; its COMMIT sleeps commitSleep.
func insert(runs *atomic.Int32, pid *atomic.Int32, commitSleep string) func(context.Context, pgx.Tx) error {
	return func(ctx context.Context, tx pgx.Tx) error {
		runs.Add(1)
		var p int32
		if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&p); err != nil {
			return err
		}
		pid.Store(p)
		if _, err := tx.Exec(ctx, "SELECT set_config('test.commit_sleep', $1, true)", commitSleep); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "INSERT INTO runs (id) VALUES (1)")
		return err
	}
}

// A transaction whose connection dies is run again when it is certain
// that the run before wrote nothing (up to MaxReruns times), and one whose COMMIT took
// effect unheard is not: Run asks the server by the transaction's id.
func TestConfirmCommit(t *testing.T) {
	t.Parallel()
	confirm := database.Policy{ConfirmCommit: true}

	t.Run("session ended before the COMMIT: run again", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		var runs, pid atomic.Int32
		err := database.Run(t.Context(), b.pool, confirm, func(ctx context.Context, tx pgx.Tx) error {
			if runs.Load() == 0 {
				var p int32
				if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&p); err != nil {
					return err
				}
				terminate(t, b, p)
			}
			return insert(&runs, &pid, "0")(ctx, tx)
		})
		if err != nil || runs.Load() != 2 || b.count(t) != 1 {
			t.Fatalf("err %v, %d runs, %d rows; want nil, 2 runs, 1 row", err, runs.Load(), b.count(t))
		}
	})

	t.Run("sessions ended before the COMMIT, run after run: run again, up to MaxReruns times", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for _, cuts := range []int{database.MaxReruns, database.MaxReruns + 1} {
			var runs, pid atomic.Int32
			err := database.Run(t.Context(), b.pool, confirm, func(ctx context.Context, tx pgx.Tx) error {
				if int(runs.Load()) < cuts {
					var p int32
					if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&p); err != nil {
						return err
					}
					terminate(t, b, p)
				}
				return insert(&runs, &pid, "0")(ctx, tx)
			})
			if cuts <= database.MaxReruns && (err != nil || int(runs.Load()) != cuts+1 || b.count(t) != 1) {
				t.Fatalf("%d cuts: err %v, %d runs, %d rows; want nil, %d runs, 1 row", cuts, err, runs.Load(), b.count(t), cuts+1)
			}
			if cuts > database.MaxReruns && (err == nil || !database.IsUnavailable(err) || int(runs.Load()) != database.MaxReruns+1 || b.count(t) != 1) {
				t.Fatalf("%d cuts: err %v, %d runs, %d rows; want unavailable, %d runs, still 1 row", cuts, err, runs.Load(), b.count(t), database.MaxReruns+1)
			}
		}
	})

	t.Run("session ended during the COMMIT: aborted, run again", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		var runs, pid atomic.Int32
		done := make(chan error, 1)
		go func() { done <- database.Run(t.Context(), b.pool, confirm, insert(&runs, &pid, "0.5")) }()
		b.whileCommitting(t, &pid, func(pid int32) { terminate(t, b, pid) })
		if err := <-done; err != nil || runs.Load() != 2 || b.count(t) != 1 {
			t.Fatalf("err %v, %d runs, %d rows; want nil, 2 runs, 1 row", err, runs.Load(), b.count(t))
		}
	})

	t.Run("COMMIT took effect, its answer lost: committed", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		var runs, pid atomic.Int32
		done := make(chan error, 1)
		go func() { done <- database.Run(t.Context(), b.pool, confirm, insert(&runs, &pid, "0.5")) }()
		b.whileCommitting(t, &pid, func(int32) {
			b.proxy.StallReplies()
			testenv.WaitFor(t, 10*time.Second, "the row committed", func() bool { return b.count(t) == 1 })
			b.proxy.Cut()
			b.proxy.Heal()
			b.proxy.Restore()
		})
		if err := <-done; err != nil || runs.Load() != 1 || b.count(t) != 1 {
			t.Fatalf("err %v, %d runs, %d rows; want nil, 1 run, 1 row", err, runs.Load(), b.count(t))
		}
	})

	t.Run("COMMIT cut off, the server out of reach: unknown", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		var runs, pid atomic.Int32
		done := make(chan error, 1)
		go func() { done <- database.Run(t.Context(), b.pool, confirm, insert(&runs, &pid, "7")) }()
		b.whileCommitting(t, &pid, func(int32) {
			b.proxy.StallReplies()
			b.proxy.Cut() // and no way back until Run gave up asking
		})
		err := <-done
		b.proxy.Heal()
		b.proxy.Restore()
		if !errors.Is(err, database.ErrCommitUnknown) || runs.Load() != 1 {
			t.Fatalf("err %v, %d runs; want ErrCommitUnknown after 1 run", err, runs.Load())
		}
		// Why it is not run again: the COMMIT goes on, and takes effect.
		testenv.WaitFor(t, 10*time.Second, "the COMMIT that was cut off", func() bool { return b.count(t) == 1 })
	})
}

// Two serializable transactions update the same row: the later one loses
// with SQLSTATE 40001, and RetryContention runs it again.
func TestRetryContention(t *testing.T) {
	t.Parallel()
	for _, retries := range []int{0, 1} {
		b := setup(t)
		if _, err := b.db.Pool.Exec(t.Context(), "INSERT INTO runs (id) VALUES (1)"); err != nil {
			t.Fatal(err)
		}
		var runs atomic.Int32
		p := database.Policy{Options: pgx.TxOptions{IsoLevel: pgx.Serializable}, RetryContention: retries}
		err := database.Run(t.Context(), b.pool, p, func(ctx context.Context, tx pgx.Tx) error {
			var n int
			if err := tx.QueryRow(ctx, "SELECT n FROM runs WHERE id = 1").Scan(&n); err != nil {
				return err
			}
			if runs.Add(1) == 1 { // another serializable transaction wins the row
				err := pgx.BeginTxFunc(ctx, b.db.Pool, p.Options, func(other pgx.Tx) error {
					_, err := other.Exec(ctx, "UPDATE runs SET n = n + 1 WHERE id = 1")
					return err
				})
				if err != nil {
					return err
				}
			}
			_, err := tx.Exec(ctx, "UPDATE runs SET n = $1 + 1 WHERE id = 1", n)
			return err
		})
		var pgErr *pgconn.PgError
		switch {
		case retries == 0 && (!errors.As(err, &pgErr) || pgErr.Code != "40001" || runs.Load() != 1):
			t.Errorf("no retries: err %v after %d runs, want SQLSTATE 40001 after 1", err, runs.Load())
		case retries == 1 && (err != nil || runs.Load() != 2):
			t.Errorf("one retry: err %v after %d runs, want nil after 2", err, runs.Load())
		}
	}
}

// Hold runs a transaction again while the database is unavailable, calls
// its hook once, and stops when ctx ends; an error of fn that is not the
// database's is not held, whatever it looks like.
func TestHold(t *testing.T) {
	t.Parallel()
	hold := func(started *atomic.Int32, ended chan<- error) database.Policy {
		return database.Policy{Hold: &database.Hold{Wait: 10 * time.Millisecond, MaxWait: 50 * time.Millisecond,
			Start: func(context.Context, error) func(error) {
				started.Add(1)
				return func(err error) { ended <- err }
			}}}
	}

	t.Run("database unreachable, then back", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		var started, runs atomic.Int32
		ended := make(chan error, 1)
		b.proxy.Cut()
		done := make(chan error, 1)
		go func() {
			done <- database.Run(t.Context(), b.pool, hold(&started, ended), func(ctx context.Context, tx pgx.Tx) error {
				runs.Add(1)
				_, err := tx.Exec(ctx, "INSERT INTO runs (id) VALUES (1)")
				return err
			})
		}()
		testenv.WaitFor(t, 10*time.Second, "the hold", func() bool { return started.Load() == 1 })
		b.proxy.Restore()
		if err := <-done; err != nil || <-ended != nil || started.Load() != 1 || runs.Load() != 1 || b.count(t) != 1 {
			t.Fatalf("err %v, hook started %d times, %d runs, %d rows; want nil, once, 1, 1", err, started.Load(), runs.Load(), b.count(t))
		}
	})

	t.Run("read-only, then writable", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		var started, runs atomic.Int32
		ended := make(chan error, 1)
		err := database.Run(t.Context(), b.pool, hold(&started, ended), func(ctx context.Context, tx pgx.Tx) error {
			if runs.Add(1) < 3 {
				if _, err := tx.Exec(ctx, "SET TRANSACTION READ ONLY"); err != nil {
					return err
				}
			}
			_, err := tx.Exec(ctx, "INSERT INTO runs (id) VALUES (1)")
			return err
		})
		if err != nil || <-ended != nil || started.Load() != 1 || runs.Load() != 3 {
			t.Fatalf("err %v, hook started %d times, %d runs; want nil, once, 3", err, started.Load(), runs.Load())
		}
	})

	t.Run("ctx ends the hold", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		var started atomic.Int32
		ended := make(chan error, 1)
		b.proxy.Cut()
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() {
			p := hold(&started, ended)
			p.Hold.Wait, p.Hold.MaxWait = time.Hour, time.Hour
			done <- database.Run(ctx, b.pool, p, func(context.Context, pgx.Tx) error { return nil })
		}()
		testenv.WaitFor(t, 10*time.Second, "the hold", func() bool { return started.Load() == 1 })
		cancel()
		select {
		case err := <-done:
			if !database.IsUnavailable(err) || <-ended == nil {
				t.Fatalf("err %v, want the database's error, also to the hook's end", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("Run held on after ctx ended")
		}
	})

	t.Run("an error that is not the database's", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		var started, runs atomic.Int32
		callErr := &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}
		err := database.Run(t.Context(), b.pool, hold(&started, make(chan error, 1)), func(context.Context, pgx.Tx) error {
			runs.Add(1)
			return callErr
		})
		if !errors.Is(err, callErr) || database.IsFault(err) || started.Load() != 0 || runs.Load() != 1 {
			t.Fatalf("err %v (fault %v), hook started %d times, %d runs; want the call's error once, not held",
				err, database.IsFault(err), started.Load(), runs.Load())
		}
	})
}

// BenchmarkTx measures what the runner costs on the normal path: the same
// insert transactions, one at a time, through pgx.BeginFunc and through
// Run with ConfirmCommit and RetryContention, in alternating slices of 100
// (a shared machine's noise falls on both alike; the first two rounds warm
// up and are not counted). It reports both rates and their ratio:
//
//	go test -run '^$' -bench Tx -benchtime 1x ./internal/database/
func BenchmarkTx(b *testing.B) {
	const slices, slice = 21, 100
	db := testenv.NewDatabase(b, migrations.Schemas...)
	if _, err := db.Pool.Exec(b.Context(), "CREATE TABLE bench (id bigint PRIMARY KEY, payload text NOT NULL)"); err != nil {
		b.Fatal(err)
	}
	var id atomic.Int64
	work := func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "INSERT INTO bench (id, payload) VALUES ($1, 'x')", id.Add(1))
		return err
	}
	policy := database.Policy{ConfirmCommit: true, RetryContention: 2}
	raw := func() error {
		return pgx.BeginFunc(b.Context(), db.Pool, func(tx pgx.Tx) error { return work(b.Context(), tx) })
	}
	run := func() error { return database.Run(b.Context(), db.Pool, policy, work) }
	var took [2]time.Duration // raw, run
	for i := range slices {
		for _, k := range []int{i % 2, 1 - i%2} {
			start := time.Now()
			for range slice {
				if err := []func() error{raw, run}[k](); err != nil {
					b.Fatal(err)
				}
			}
			if i > 1 {
				took[k] += time.Since(start)
			}
		}
	}
	n := float64((slices - 2) * slice)
	rawRate, runRate := n/took[0].Seconds(), n/took[1].Seconds()
	b.ReportMetric(rawRate, "raw-tx/s")
	b.ReportMetric(runRate, "run-tx/s")
	b.ReportMetric(runRate/rawRate, "ratio")
}

// BenchmarkQueryExecMode compares pgx's ways to run a statement on what the
// service runs most: Run's write transaction (an insert, a read back of
// the row by key, ConfirmCommit), in alternating slices per mode as
// BenchmarkTx does. cache_statement is pgx's default, whose named prepared
// statements do not survive a pooler in transaction mode; the others name
// none. It reports each mode's rate and its ratio to cache_statement:
//
//	go test -run '^$' -bench QueryExecMode -benchtime 1x ./internal/database/
func BenchmarkQueryExecMode(b *testing.B) {
	const slices, slice = 11, 200
	db := testenv.NewDatabase(b, migrations.Schemas...)
	if _, err := db.Pool.Exec(b.Context(), "CREATE TABLE bench (id bigint PRIMARY KEY, payload text NOT NULL, at timestamptz NOT NULL DEFAULT now())"); err != nil {
		b.Fatal(err)
	}
	modes := []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeExec,
		pgx.QueryExecModeDescribeExec, pgx.QueryExecModeCacheDescribe}
	pools := make([]*pgxpool.Pool, len(modes))
	for i, mode := range modes {
		cfg, err := pgxpool.ParseConfig(db.URL)
		if err != nil {
			b.Fatal(err)
		}
		cfg.ConnConfig.DefaultQueryExecMode = mode
		if pools[i], err = pgxpool.NewWithConfig(b.Context(), cfg); err != nil {
			b.Fatal(err)
		}
		defer pools[i].Close()
	}
	var id atomic.Int64
	work := func(ctx context.Context, tx pgx.Tx) error {
		n := id.Add(1)
		if _, err := tx.Exec(ctx, "INSERT INTO bench (id, payload) VALUES ($1, $2)", n, "x"); err != nil {
			return err
		}
		var at time.Time
		return tx.QueryRow(ctx, "SELECT at FROM bench WHERE id = $1 AND payload = $2", n, "x").Scan(&at)
	}
	policy := database.Policy{ConfirmCommit: true}
	took := make([]time.Duration, len(modes))
	for i := range slices {
		for j := range modes {
			k := (i + j) % len(modes)
			start := time.Now()
			for range slice {
				if err := database.Run(b.Context(), pools[k], policy, work); err != nil {
					b.Fatal(err)
				}
			}
			if i > 0 {
				took[k] += time.Since(start)
			}
		}
	}
	n := float64((slices - 1) * slice)
	for k, mode := range modes {
		name := strings.ReplaceAll(mode.String(), " ", "_")
		b.ReportMetric(n/took[k].Seconds(), name+"-tx/s")
		if k > 0 {
			b.ReportMetric(took[0].Seconds()/took[k].Seconds(), name+"-ratio")
		}
	}
}
