package testenv_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/yourorg/orders/internal/testenv"
	"github.com/yourorg/orders/migrations"
)

// TestMain is what the packages that use LogicalPostgres have: the tests,
// then the server stopped, then the check for goroutines left running.
func TestMain(m *testing.M) { testenv.VerifyNoLeaks(m) }

// The logical server: wal_level=logical, its own port, one per binary;
// NewDatabase gives each test a database of its own with the migrated
// schema, the process roles and room for a logical slot, and drops it at
// the end of the test, slots and all; Terminate ends a client's session.
func TestLogicalPostgres(t *testing.T) {
	ctx := context.Background()
	s := testenv.LogicalPostgres(t)
	if s.Port == 5432 || !strings.Contains(s.AdminURL, ":"+strconv.Itoa(s.Port)+"/postgres") {
		t.Fatalf("server on port %d at %s: want a port of its own, in its AdminURL", s.Port, s.AdminURL)
	}
	if again := testenv.LogicalPostgres(t); again != s {
		t.Fatal("a second LogicalPostgres started another server")
	}

	var names []string
	t.Run("databases", func(t *testing.T) {
		a, b := s.NewDatabase(t, migrations.Schemas...), s.NewDatabase(t, migrations.Schemas...)
		names = []string{a.Name, b.Name}
		if a.Name == b.Name || a.URL == b.URL {
			t.Fatalf("two NewDatabase gave %s and %s", a.URL, b.URL)
		}
		for _, db := range []*testenv.Database{a, b} {
			var walLevel, current string
			var outbox bool
			if err := db.Pool.QueryRow(ctx, "SELECT current_setting('wal_level'), current_database(), to_regclass('message_outbox') IS NOT NULL").
				Scan(&walLevel, &current, &outbox); err != nil {
				t.Fatal(err)
			}
			if walLevel != "logical" || current != db.Name || !outbox {
				t.Errorf("%s: wal_level %s, current_database %s, message_outbox exists %t; want logical, %s, true",
					db.Name, walLevel, current, outbox, db.Name)
			}
		}
		// Two databases, not one twice: what one test does the other does
		// not see.
		if _, err := a.Pool.Exec(ctx, "CREATE TABLE only_in_a ()"); err != nil {
			t.Fatal(err)
		}
		var inB bool
		if err := b.Pool.QueryRow(ctx, "SELECT to_regclass('only_in_a') IS NOT NULL").Scan(&inB); err != nil || inB {
			t.Fatalf("a table of %s is in %s too (%v)", a.Name, b.Name, err)
		}
		// The migrations created the process roles on this new server, and
		// it trusts them as the shared one does.
		relay, err := pgx.Connect(ctx, a.URLAs(migrations.RoleRelay))
		if err != nil {
			t.Fatalf("connect as %s: %v", migrations.RoleRelay, err)
		}
		if _, err := relay.Exec(ctx, "SELECT count(*) FROM message_outbox"); err != nil {
			t.Errorf("%s reads message_outbox: %v", migrations.RoleRelay, err)
		}
		_ = relay.Close(ctx)

		// A logical slot with pgoutput, the log-tailing relay's plugin.
		slot := "t_" + strings.TrimPrefix(a.Name, "orders_test_")
		if _, err := a.Pool.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", slot); err != nil {
			t.Fatal(err)
		}
		var plugin, database string
		if err := a.Pool.QueryRow(ctx, "SELECT plugin, database FROM pg_replication_slots WHERE slot_name = $1", slot).
			Scan(&plugin, &database); err != nil || plugin != "pgoutput" || database != a.Name {
			t.Fatalf("slot %s: plugin %q, database %q, %v; want pgoutput on %s", slot, plugin, database, err, a.Name)
		}
		if _, err := a.Pool.Exec(ctx, "SELECT pg_drop_replication_slot($1)", slot); err != nil {
			t.Fatal(err)
		}
		// One left behind, as a failing relay test would: DROP DATABASE
		// refuses while it exists, so the cleanup has to drop it first.
		if _, err := b.Pool.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", "t_left_"+slot); err != nil {
			t.Fatal(err)
		}

		// Terminate ends the sessions of one application, and only those.
		victim := connectAs(t, a.URL, "victim")
		bystander := connectAs(t, a.URL, "bystander")
		if n := s.Terminate(t, a.Name, "victim"); n != 1 {
			t.Errorf("Terminate ended %d sessions, want 1", n)
		}
		if err := victim.Ping(ctx); err == nil {
			t.Error("the terminated session still answers")
		}
		if err := bystander.Ping(ctx); err != nil {
			t.Errorf("another application's session was ended too: %v", err)
		}
	})

	admin, err := pgx.Connect(ctx, s.AdminURL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	var left []string
	if err := admin.QueryRow(ctx, `SELECT coalesce(array_agg(datname::text), '{}') FROM pg_database WHERE datname = ANY($1)`, names).Scan(&left); err != nil {
		t.Fatal(err)
	}
	var slots int
	if err := admin.QueryRow(ctx, "SELECT count(*) FROM pg_replication_slots").Scan(&slots); err != nil {
		t.Fatal(err)
	}
	if len(names) != 2 || len(left) != 0 || slots != 0 {
		t.Fatalf("after the subtest: databases %v of %v and %d replication slots left, want none", left, names, slots)
	}
}

// StopLogicalPostgres stops the server and removes its directory, and a
// later LogicalPostgres starts another. Not parallel: it stops the server
// every test of the binary shares.
func TestLogicalPostgresStop(t *testing.T) {
	ctx := context.Background()
	s := testenv.LogicalPostgres(t)
	var dataDir string
	conn, err := pgx.Connect(ctx, s.AdminURL)
	if err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRow(ctx, "SHOW data_directory").Scan(&dataDir); err != nil {
		t.Fatal(err)
	}
	_ = conn.Close(ctx)
	// The server's own directory, where it runs from installed binaries (a
	// container's is not on this machine).
	dir := filepath.Dir(dataDir)
	_, statErr := os.Stat(dir)
	local := statErr == nil

	testenv.StopLogicalPostgres()
	if _, err := os.Stat(dir); local && !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s is still there after StopLogicalPostgres (%v)", dir, err)
	}
	if conn, err := pgx.Connect(ctx, s.AdminURL); err == nil {
		_ = conn.Close(ctx)
		t.Fatalf("%s still answers after StopLogicalPostgres", s.AdminURL)
	}

	again := testenv.LogicalPostgres(t)
	if again == s {
		t.Fatal("LogicalPostgres after StopLogicalPostgres returned the stopped server")
	}
	db := again.NewDatabase(t, migrations.Schemas...)
	if err := db.Pool.Ping(ctx); err != nil {
		t.Fatal(err)
	}
}

func connectAs(t *testing.T, dbURL, app string) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["application_name"] = app
	conn, err := pgx.ConnectConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}
