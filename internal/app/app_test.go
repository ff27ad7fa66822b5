package app

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/yourorg/orders/migrations"

	"github.com/jackc/pgx/v5"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/yourorg/orders/internal/config"
	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/telemetry"
	"github.com/yourorg/orders/internal/testenv"
)

// lateServer is a PostgreSQL server that is not up yet, as docker compose
// starts it next to migrate: a proxy to the test server that refuses
// connections until the test restores it.
type lateServer struct {
	proxy *testenv.Proxy
	url   string // the database, through the proxy
}

// newLateServer returns the late server of direct, a URL of the test
// server.
func newLateServer(t *testing.T, direct string) lateServer {
	t.Helper()
	proxy := testenv.NewProxy(t, testenv.HostPort(direct))
	proxy.Cut()
	return lateServer{proxy: proxy, url: proxy.Rewrite(direct)}
}

// newDatabaseName returns a URL of the test server naming a database that
// does not exist yet (migrate creates it), dropped when t ends.
func newDatabaseName(t *testing.T) string {
	t.Helper()
	name := testenv.TestDatabaseName()
	testenv.DropDatabaseAtCleanup(t, name)
	return testenv.ServerURL(t, name)
}

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// migrate runs the migrate sub-command in the background; its error
// arrives on the channel.
func migrate(ctx context.Context, db config.Database) <-chan error {
	errc := make(chan error, 1)
	go func() { errc <- RunMigrate(ctx, db, []string{"up"}, discardLogger(), io.Discard) }()
	return errc
}

// migrate waits for a server that accepts connections only after a while,
// then creates the database and applies the migrations.
func TestMigrateWaitsForALateServer(t *testing.T) {
	t.Parallel()
	srv := newLateServer(t, newDatabaseName(t))

	start := time.Now()
	errc := migrate(t.Context(), config.Database{URL: srv.url, ConnectTimeout: 30 * time.Second})
	const late = 1500 * time.Millisecond
	select {
	case err := <-errc:
		t.Fatalf("migrate returned while the server refused connections: %v", err)
	case <-time.After(late):
	}
	srv.proxy.Restore()
	if err := <-errc; err != nil {
		t.Fatalf("migrate: %v", err)
	}
	t.Logf("migrated after %s, the server up after %s", time.Since(start).Round(time.Millisecond), late)

	conn, err := pgx.Connect(t.Context(), srv.url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.WithoutCancel(t.Context()))
	var applied int
	if err := conn.QueryRow(t.Context(), "SELECT count(*) FROM goose_db_version WHERE version_id > 0").Scan(&applied); err != nil {
		t.Fatal(err)
	}
	if applied == 0 {
		t.Fatal("no migration applied")
	}
}

// migrate gives up on a server that never comes up once DB_CONNECT_TIMEOUT
// has passed, with an error that says what it waited for and how long.
func TestMigrateGivesUpAfterTheDeadline(t *testing.T) {
	t.Parallel()
	srv := newLateServer(t, newDatabaseName(t))

	const deadline = time.Second
	start := time.Now()
	var err error
	select {
	case err = <-migrate(t.Context(), config.Database{URL: srv.url, ConnectTimeout: deadline}):
	case <-time.After(20 * time.Second):
		t.Fatal("migrate still waiting 20s after a deadline of 1s")
	}
	took := time.Since(start)
	if err == nil {
		t.Fatal("migrate succeeded against a server that refuses every connection")
	}
	t.Logf("after %s: %v", took.Round(time.Millisecond), err)
	if took < deadline {
		t.Errorf("migrate gave up after %s, before the deadline of %s", took, deadline)
	}
	for _, want := range []string{"PostgreSQL at " + srv.proxy.Addr() + " not reachable", "gave up after 1s", "connect"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}

// Every binary's first connection waits for the server too (OpenDatabase,
// through database.NewPool), up to the same deadline.
func TestOpenDatabaseWaitsForALateServer(t *testing.T) {
	t.Parallel()
	srv := newLateServer(t, testenv.NewDatabase(t, migrations.Schemas...).URL)
	db := config.Database{URL: srv.url, MaxConns: 2, ConnectTimeout: 30 * time.Second}
	tel := &telemetry.Telemetry{Logger: discardLogger(), TracerProvider: tracenoop.NewTracerProvider(), MeterProvider: metricnoop.NewMeterProvider()}

	errc := make(chan error, 1)
	go func() {
		// migrate false: the pool's own wait, not migrate's.
		pool, err := OpenDatabase(t.Context(), database.PoolConfig{AppName: "test"}, db, false, tel)
		if err == nil {
			err = pool.Ping(t.Context())
			pool.Close()
		}
		errc <- err
	}()
	select {
	case err := <-errc:
		t.Fatalf("OpenDatabase returned while the server refused connections: %v", err)
	case <-time.After(time.Second):
	}
	srv.proxy.Restore()
	if err := <-errc; err != nil {
		t.Fatalf("OpenDatabase: %v", err)
	}
}
