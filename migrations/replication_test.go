package migrations_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/yourorg/orders/internal/app"
	"github.com/yourorg/orders/internal/config"
	"github.com/yourorg/orders/internal/database"
	inbox "github.com/yourorg/orders/internal/messaging/inbox/migrations"
	outbox "github.com/yourorg/orders/internal/messaging/outbox/migrations"
	"github.com/yourorg/orders/internal/store"
	"github.com/yourorg/orders/internal/testenv"
	service "github.com/yourorg/orders/migrations"
)

// Every goroutine a test starts ends with it; this binary's logical
// server stops after the tests.
func TestMain(m *testing.M) { testenv.VerifyNoLeaks(m) }

// The REPLICATION attribute lets a role create a logical slot with any
// output plugin and read every row of every table through it, whatever its
// grants. These tests run on this binary's own server (wal_level=logical,
// replication trusted in pg_hba), one after the other and before the
// package's parallel tests: a role belongs to the whole server, and a
// database migrated beside them (00015 grants, 00019 takes back) would
// change what they look at.

// A database migrated before 00019 (as a superuser, so 00015 gave
// orders_relay REPLICATION) loses the attribute at the next migrate, which
// in the default configuration makes no replication role: the polling
// relay's role can open no replication connection, logical or physical,
// and create no slot.
func TestRelayRoleLosesReplication(t *testing.T) {
	srv := testenv.LogicalPostgres(t)
	db := srv.NewDatabase(t, outbox.Schema)
	ctx := t.Context()

	before := database.Schema{Name: "orders", FS: migrationsBefore(t, 19), VersionTable: service.Schema.VersionTable}
	m, err := database.NewMigrator(db.Pool, testenv.Logger(), outbox.Schema, inbox.Schema, before)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = m.Close() }()
	if err := m.Up(ctx); err != nil {
		t.Fatal(err)
	}
	if !replicates(t, db, service.RoleRelay) {
		t.Fatal("at migration 18, as a superuser, orders_relay has no REPLICATION: the upgrade below proves nothing")
	}

	migrate(t, db, false)
	if replicates(t, db, service.RoleRelay) {
		t.Fatal("after migrate, orders_relay still has REPLICATION")
	}
	var walRole bool
	if err := db.Pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)", service.RoleRelayWAL).Scan(&walRole); err != nil || walRole {
		t.Fatalf("migrate without MIGRATE_RELAY_WAL_ROLE made %s (%v, %v)", service.RoleRelayWAL, walRole, err)
	}
	cannotReplicate(t, db, service.RoleRelay)
}

// With MIGRATE_RELAY_WAL_ROLE, migrate makes orders_relay_wal: it can
// create its slot and stream the outbox's publication, which carries
// message_outbox and no other table; it is granted no table; and the
// polling relay's role still cannot replicate.
func TestWALRoleStreamsOnlyTheOutbox(t *testing.T) {
	srv := testenv.LogicalPostgres(t)
	db := srv.NewDatabase(t, service.Schemas...)
	ctx := t.Context()
	migrate(t, db, true)
	if !replicates(t, db, service.RoleRelayWAL) {
		t.Fatalf("after migrate with MIGRATE_RELAY_WAL_ROLE, %s has no REPLICATION", service.RoleRelayWAL)
	}
	var granted bool
	if err := db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_class c
		WHERE c.relnamespace = 'public'::regnamespace AND c.relkind = 'r'
		  AND has_table_privilege($1, c.oid, 'SELECT, INSERT, UPDATE, DELETE'))`, service.RoleRelayWAL).Scan(&granted); err != nil || granted {
		t.Fatalf("%s has a privilege on a table (%v, %v)", service.RoleRelayWAL, granted, err)
	}
	cannotReplicate(t, db, service.RoleRelay)

	repl, err := pgconn.Connect(ctx, replication(t, db, service.RoleRelayWAL, "database"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = repl.Close(context.Background()) }()
	_, err = pglogrepl.CreateReplicationSlot(ctx, repl, "wal_role_"+db.Name, "pgoutput",
		pglogrepl.CreateReplicationSlotOptions{Temporary: true, Mode: pglogrepl.LogicalReplication, SnapshotAction: "NOEXPORT_SNAPSHOT"})
	if err != nil {
		t.Fatalf("%s creates its slot: %v", service.RoleRelayWAL, err)
	}
	err = pglogrepl.StartReplication(ctx, repl, "wal_role_"+db.Name, 0, pglogrepl.StartReplicationOptions{
		Mode: pglogrepl.LogicalReplication, PluginArgs: []string{"proto_version '1'", "publication_names 'orders_outbox'"},
	})
	if err != nil {
		t.Fatal(err)
	}

	// An order, then an outbox row, each committed: the stream carries the
	// second and nothing of the first.
	order := uuid.New()
	if _, err := db.Pool.Exec(ctx, `INSERT INTO orders (order_id, customer_id, currency, status, total_cents)
		VALUES ($1, 'customer-secret', 'EUR', 'SUBMITTED', 4200)`, order); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `INSERT INTO message_outbox (outbox_id, aggregate_type, aggregate_id, message_type, message_version, exchange_name, routing_key, payload)
		VALUES ($1, 'order', $2, 'order.cancelled', 1, 'orders.events', 'order.cancelled', '{}')`, uuid.New(), order.String()); err != nil {
		t.Fatal(err)
	}
	var relations []string
	names := map[uint32]string{}
	inserted := ""

	recvCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	for inserted == "" {
		msg, err := repl.ReceiveMessage(recvCtx)
		if err != nil {
			t.Fatalf("stream as %s: %v (relations so far %v)", service.RoleRelayWAL, err, relations)
		}
		data, ok := msg.(*pgproto3.CopyData)
		if !ok || len(data.Data) == 0 || data.Data[0] != pglogrepl.XLogDataByteID {
			continue
		}
		xld, err := pglogrepl.ParseXLogData(data.Data[1:])
		if err != nil {
			t.Fatal(err)
		}
		logical, err := pglogrepl.Parse(xld.WALData)
		if err != nil {
			t.Fatal(err)
		}
		switch m := logical.(type) {
		case *pglogrepl.RelationMessage:
			relations = append(relations, m.RelationName)
			names[m.RelationID] = m.RelationName
		case *pglogrepl.InsertMessage:
			inserted = names[m.RelationID]
		}
	}
	// The insert goes through message_outbox (publish_via_partition_root);
	// PostgreSQL also describes the time partition it landed in.
	for _, r := range relations {
		if r != "message_outbox" && !strings.HasPrefix(r, "message_outbox_") {
			t.Fatalf("the outbox's publication streamed the tables %v; want message_outbox and its partitions alone", relations)
		}
	}
	if inserted != "message_outbox" {
		t.Fatalf("the outbox row was streamed as an insert into %q; want message_outbox", inserted)
	}
}

// migrationsBefore is the service's migrations older than version.
func migrationsBefore(t *testing.T, version int) fs.FS {
	t.Helper()
	files, err := fs.Glob(service.FS, "*.sql")
	if err != nil {
		t.Fatal(err)
	}
	older := fstest.MapFS{}
	for _, f := range files {
		v, err := strconv.Atoi(f[:5])
		if err != nil {
			t.Fatal(err)
		}
		if v < version {
			src, err := fs.ReadFile(service.FS, f)
			if err != nil {
				t.Fatal(err)
			}
			older[f] = &fstest.MapFile{Data: src}
		}
	}
	return older
}

// migrate runs `migrate up` on db as the server's superuser, with
// MIGRATE_RELAY_WAL_ROLE set to walRole.
func migrate(t *testing.T, db *testenv.Database, walRole bool) {
	t.Helper()
	cfg := config.Database{URL: db.URL, ConnectTimeout: 30 * time.Second, MigrateRelayWALRole: walRole}
	if err := app.RunMigrate(t.Context(), cfg, []string{"up"}, testenv.Logger(), io.Discard); err != nil {
		t.Fatal(err)
	}
}

// replicates reports whether role has the REPLICATION attribute.
func replicates(t *testing.T, db *testenv.Database, role string) bool {
	t.Helper()
	var yes bool
	if err := db.Pool.QueryRow(t.Context(), "SELECT rolreplication FROM pg_roles WHERE rolname = $1", role).Scan(&yes); err != nil {
		t.Fatalf("role %s: %v", role, err)
	}
	return yes
}

// cannotReplicate fails t unless the server refuses role a logical and a
// physical replication connection, and a slot made through SQL
// (insufficient_privilege each time).
func cannotReplicate(t *testing.T, db *testenv.Database, role string) {
	t.Helper()
	ctx := t.Context()
	refused := func(what string, err error) {
		t.Helper()
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "42501" {
			t.Errorf("%s as %s: %v; want insufficient_privilege (42501)", what, role, err)
		}
	}
	for _, mode := range []string{"database", "true"} {
		conn, err := pgconn.Connect(ctx, replication(t, db, role, mode))
		if err == nil {
			_ = conn.Close(ctx)
		}
		refused("a replication connection (replication="+mode+")", err)
	}
	conn, err := pgconn.Connect(ctx, db.URLAs(role))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	_, err = conn.Exec(ctx, "SELECT pg_create_logical_replication_slot('relay_"+db.Name+"', 'test_decoding', true)").ReadAll()
	refused("pg_create_logical_replication_slot", err)
}

// replication is the URL of a replication connection to db as role: mode
// "database" is logical replication, "true" physical.
func replication(t *testing.T, db *testenv.Database, role, mode string) string {
	t.Helper()
	u, err := url.Parse(db.URLAs(role))
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("replication", mode)
	u.RawQuery = q.Encode()
	return u.String()
}

// Migrated by an owner that is no superuser (compose's orders_migrate),
// migrate cannot change REPLICATION: it logs what a superuser runs, for
// orders_relay still having it (a volume made before 00019) and for
// orders_relay_wal asked for and missing.
func TestRelayRolesAsAnOwnerLogWhatASuperuserRuns(t *testing.T) {
	srv := testenv.LogicalPostgres(t)
	db := srv.NewDatabase(t, service.Schemas...)
	ctx := t.Context()
	owner := fmt.Sprint("orders_test_owner_", time.Now().UnixNano())
	for _, sql := range []string{"CREATE ROLE " + owner + " LOGIN", "ALTER ROLE orders_relay REPLICATION", "DROP ROLE IF EXISTS " + service.RoleRelayWAL} {
		if _, err := db.Pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, sql := range []string{"ALTER ROLE orders_relay NOREPLICATION", "DROP ROLE " + owner} {
			if _, err := db.Pool.Exec(context.Background(), sql); err != nil {
				t.Errorf("%s: %v", sql, err)
			}
		}
	})
	pool, err := pgxpool.New(ctx, db.URLAs(owner))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var logs bytes.Buffer
	if err := store.RelayWALRole(ctx, pool, slog.New(slog.NewTextHandler(&logs, nil)), true); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"ALTER ROLE orders_relay NOREPLICATION", "CREATE ROLE " + service.RoleRelayWAL + " LOGIN REPLICATION"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("the log does not say %q:\n%s", want, logs.String())
		}
	}
	var exists bool
	if err := db.Pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)", service.RoleRelayWAL).Scan(&exists); err != nil || exists {
		t.Fatalf("%s exists (%v, %v)", service.RoleRelayWAL, exists, err)
	}
}
