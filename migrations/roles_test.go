package migrations_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/store"
	"github.com/yourorg/orders/internal/testenv"
	"github.com/yourorg/orders/migrations"
)

const (
	api      = migrations.RoleAPI
	relay    = migrations.RoleRelay
	consumer = migrations.RoleConsumer
	operator = migrations.RoleOperator
)

// grants is what each process role may do with each table of the schema,
// written as privileges(columns) the way privilegesOf reports them: a
// privilege on the whole table, or on the columns listed. Every table has a
// row naming every role ("" is nothing), so that a migration adding a table
// must decide, here and in its GRANTs, who may touch it. docs/security.md
// explains each grant.
var grants = map[string]map[string]string{
	// The version tables of the migrations: their owner's alone.
	"goose_db_version":      {api: "", relay: "", consumer: "", operator: ""},
	"outbox_schema_version": {api: "", relay: "", consumer: "", operator: ""},
	"inbox_schema_version":  {api: "", relay: "", consumer: "", operator: ""},
	"orders": {
		api:      "SELECT, INSERT(order_id, customer_id, currency, status, version, total_cents), UPDATE(status, version, updated_at)",
		relay:    "",
		consumer: "SELECT(order_id, status, version, created_at, updated_at), UPDATE(status, version, updated_at)",
		operator: "SELECT",
	},
	"order_items": {api: "SELECT, INSERT", relay: "", consumer: "", operator: "SELECT"},
	"order_state_transition": {
		api:      "SELECT, INSERT(order_id, from_status, to_status, message_id, correlation_id, created_at, reason)",
		relay:    "",
		consumer: "SELECT(order_id, message_id), INSERT(order_id, from_status, to_status, message_id, correlation_id, reason)",
		operator: "SELECT",
	},
	"message_outbox": {
		api:      "INSERT(outbox_id, aggregate_type, aggregate_id, message_type, message_version, exchange_name, routing_key, payload, headers)",
		relay:    "SELECT, UPDATE(status, attempt_count, next_attempt_at, claimed_by, claimed_until, published_at, last_error, updated_at), DELETE",
		consumer: "INSERT(outbox_id, aggregate_type, aggregate_id, message_type, message_version, exchange_name, routing_key, payload, headers)",
		operator: "SELECT, UPDATE(status, attempt_count, next_attempt_at, updated_at), DELETE",
	},
	"message_inbox": {api: "", relay: "", consumer: "SELECT, INSERT, UPDATE, DELETE", operator: "SELECT, DELETE"},
	"http_idempotency_key": {
		api: "SELECT, INSERT(idempotency_key, request_method, request_path, request_hash, caller, caller_role), " +
			"UPDATE(request_hash, response_status, response_body, response_location, created_at), DELETE",
		relay:    "",
		consumer: "",
		operator: "SELECT, DELETE",
	},
	"stock_reservation": {api: "", relay: "", consumer: "SELECT, INSERT, UPDATE(status, updated_at)", operator: "SELECT"},
	"customer_notification": {
		api:      "SELECT",
		relay:    "",
		consumer: "SELECT, INSERT, UPDATE(status, attempt_count, last_error, sent_at)",
		operator: "SELECT",
	},
	"shipment":               {api: "", relay: "", consumer: "SELECT(order_id), INSERT(shipment_id, order_id, status, message_id, reservation_id)", operator: "SELECT"},
	"operator_audit":         {api: "", relay: "", consumer: "", operator: "SELECT, INSERT(actor, action, target, reason, details)"},
	"outbox_partition_lease": {api: "", relay: "SELECT, INSERT, UPDATE, DELETE", consumer: "", operator: "SELECT"},
	"outbox_relay":           {api: "", relay: "SELECT, INSERT, UPDATE, DELETE", consumer: "", operator: "SELECT"},
}

// functionGrants is which process role may execute each function of the
// schema ("EXECUTE" or ""), by its signature as regprocedure prints it.
// PostgreSQL lets PUBLIC execute a new function, so every function has a
// row and a migration that adds one must revoke that and decide who may
// call it.
var functionGrants = map[string]map[string]string{
	// The outbox's trigger function: a trigger runs it without EXECUTE.
	"message_outbox_notify()": {api: "", relay: "", consumer: "", operator: ""},
	// One aggregate's messages, which the /ui/ timeline and orderctl show.
	"inbox_rows_of_aggregate(text)":           {api: "EXECUTE", relay: "", consumer: "", operator: "EXECUTE"},
	"outbox_messages_of_aggregate(text,text)": {api: "EXECUTE", relay: "", consumer: "", operator: "EXECUTE"},
	// The same from a time on: the timeline's, which skip older partitions.
	"inbox_rows_of_aggregate_since(text,timestamp with time zone)":           {api: "EXECUTE", relay: "", consumer: "", operator: "EXECUTE"},
	"outbox_messages_of_aggregate_since(text,text,timestamp with time zone)": {api: "EXECUTE", relay: "", consumer: "", operator: "EXECUTE"},
	// The partition of an aggregate's messages, which the relays' claim uses.
	"outbox_partition(text,integer)": {api: "", relay: "EXECUTE", consumer: "", operator: ""},
	// Where the claim's earlier-row check starts, which the claim calls.
	"outbox_oldest_unpublished()": {api: "", relay: "EXECUTE", consumer: "", operator: ""},
	// The outbox's time partitions: made ahead by the relays, listed by
	// orderctl, dropped by either's retention.
	"outbox_time_partition_bounds()":              {api: "", relay: "", consumer: "", operator: ""},
	"outbox_create_time_partitions(text,integer)": {api: "", relay: "EXECUTE", consumer: "", operator: ""},
	"outbox_time_partitions(interval,boolean)":    {api: "", relay: "EXECUTE", consumer: "", operator: "EXECUTE"},
	// The inbox's, by the consumers.
	"inbox_time_partition_bounds()":              {api: "", relay: "", consumer: "", operator: ""},
	"inbox_create_time_partitions(text,integer)": {api: "", relay: "", consumer: "EXECUTE", operator: ""},
	"inbox_time_partitions(interval,boolean)":    {api: "", relay: "", consumer: "EXECUTE", operator: "EXECUTE"},
}

// No role may use a sequence: the identity columns draw their values
// without it, and nothing else calls nextval.
const sequenceGrant = ""

// Every table, sequence and function of the schema, for every process
// role, has exactly the privileges of the matrices above: a table or a
// function added without a decision, or a grant that differs from the one
// written down, fails with the line to write.
func TestRoleGrants(t *testing.T) {
	t.Parallel()
	db := testenv.NewDatabase(t, migrations.Schemas...)
	checkGrants(t, db.Pool, grants)
	checkFunctionGrants(t, db.Pool, functionGrants)
}

// checkFunctionGrants compares who may execute each function of the public
// schema with want.
func checkFunctionGrants(t *testing.T, db database.DBTX, want map[string]map[string]string) {
	t.Helper()
	ctx := t.Context()
	rows, err := db.Query(ctx, `SELECT oid::regprocedure::text FROM pg_proc WHERE pronamespace = 'public'::regnamespace ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	functions, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	executes := func(role, fn string) string {
		var has bool
		if err := db.QueryRow(ctx, `SELECT has_function_privilege($1, $2::regprocedure, 'EXECUTE')`, role, fn).Scan(&has); err != nil {
			t.Fatal(err)
		}
		if has {
			return "EXECUTE"
		}
		return ""
	}
	for _, fn := range functions {
		row, ok := want[fn]
		if !ok {
			var line []string
			for _, role := range migrations.Roles {
				line = append(line, fmt.Sprintf("%s: %q", roleConst(role), executes(role, fn)))
			}
			t.Errorf("function %s has no row in functionGrants: REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC in the migration that "+
				"creates it, GRANT EXECUTE to the roles that call it (docs/security.md), and add its row to functionGrants in "+
				"migrations/roles_test.go; what the roles have now: %q: {%s}", fn, fn, fn, strings.Join(line, ", "))
			continue
		}
		for _, role := range migrations.Roles {
			wantPriv, ok := row[role]
			if !ok {
				t.Errorf("function %s: functionGrants says nothing of %s: write \"EXECUTE\" or \"\"", fn, role)
				continue
			}
			if got := executes(role, fn); got != wantPriv {
				t.Errorf("function %s, role %s: has %q, want %q\nGRANT or REVOKE the difference (PUBLIC's EXECUTE counts), or correct "+
					"functionGrants (migrations/roles_test.go) and docs/security.md", fn, role, got, wantPriv)
			}
		}
	}
	for _, fn := range slices.Sorted(maps.Keys(want)) {
		if !slices.Contains(functions, fn) {
			t.Errorf("functionGrants has a row for %s, which the schema does not have: remove it", fn)
		}
	}
}

// checkGrants compares what the roles have on every relation of the public
// schema with want.
func checkGrants(t *testing.T, db database.DBTX, want map[string]map[string]string) {
	t.Helper()
	ctx := t.Context()
	tables := relations(t, db, "r", "p")
	for _, table := range tables {
		row, ok := want[table]
		if !ok {
			var line []string
			for _, role := range migrations.Roles {
				line = append(line, fmt.Sprintf("%s: %q", roleConst(role), privilegesOf(t, db, role, table)))
			}
			t.Errorf("table %s has no row in the grant matrix: decide what each process may do with it, GRANT that in "+
				"the migration that creates it (docs/security.md), and add its row to grants in migrations/roles_test.go; "+
				"what the roles have now: %q: {%s}", table, table, strings.Join(line, ", "))
			continue
		}
		for _, role := range migrations.Roles {
			wantPriv, ok := row[role]
			if !ok {
				t.Errorf("table %s: the matrix says nothing of %s: write what it may do (\"\" for nothing)", table, role)
				continue
			}
			if got := privilegesOf(t, db, role, table); got != wantPriv {
				t.Errorf("table %s, role %s:\n has  %q\n want %q\nGRANT or REVOKE the difference in a new migration, or correct the matrix (migrations/roles_test.go) and docs/security.md",
					table, role, got, wantPriv)
			}
		}
	}
	for _, table := range slices.Sorted(maps.Keys(want)) {
		if !slices.Contains(tables, table) {
			t.Errorf("the grant matrix has a row for %s, which the schema does not have: remove it", table)
		}
	}
	// A time partition (of message_outbox or message_inbox) is read and
	// written through its table: it grants nothing of its own.
	partitions, err := db.Query(ctx, `SELECT relname FROM pg_class WHERE relnamespace = 'public'::regnamespace AND relispartition`)
	if err != nil {
		t.Fatal(err)
	}
	names, err := pgx.CollectRows(partitions, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	for _, partition := range names {
		for _, role := range migrations.Roles {
			if got := privilegesOf(t, db, role, partition); got != "" {
				t.Errorf("time partition %s grants %s %q: a partition is reached through its table, and grants nothing", partition, role, got)
			}
		}
	}
	for _, seq := range relations(t, db, "S") {
		for _, role := range migrations.Roles {
			var got []string
			for _, p := range []string{"USAGE", "SELECT", "UPDATE"} {
				var has bool
				if err := db.QueryRow(ctx, `SELECT has_sequence_privilege($1, $2::regclass, $3)`, role, seq, p).Scan(&has); err != nil {
					t.Fatal(err)
				}
				if has {
					got = append(got, p)
				}
			}
			if g := strings.Join(got, ", "); g != sequenceGrant {
				t.Errorf("sequence %s, role %s: has %q, want %q (identity columns need no sequence privilege)", seq, role, g, sequenceGrant)
			}
		}
	}
}

// relations lists the relations of the public schema of the given kinds
// (pg_class.relkind).
func relations(t *testing.T, db database.DBTX, kinds ...string) []string {
	t.Helper()
	rows, err := db.Query(t.Context(), `SELECT relname FROM pg_class
		WHERE relnamespace = 'public'::regnamespace AND relkind = ANY ($1::"char"[]) AND NOT relispartition ORDER BY relname`, kinds)
	if err != nil {
		t.Fatal(err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return names
}

// privilegesOf describes what role may do with table: each privilege it
// has on the whole table, or on some of its columns, as PRIVILEGE(col, ...),
// in a fixed order.
func privilegesOf(t *testing.T, db database.DBTX, role, table string) string {
	t.Helper()
	var out []string
	for _, p := range []string{"SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER"} {
		var whole bool
		if err := db.QueryRow(t.Context(), `SELECT has_table_privilege($1, $2::regclass, $3)`, role, table, p).Scan(&whole); err != nil {
			t.Fatal(err)
		}
		if whole {
			out = append(out, p)
			continue
		}
		if p == "DELETE" || p == "TRUNCATE" || p == "TRIGGER" {
			continue // no column privileges of these kinds
		}
		rows, err := db.Query(t.Context(), `SELECT attname FROM pg_attribute
			WHERE attrelid = $2::regclass AND attnum > 0 AND NOT attisdropped AND has_column_privilege($1, $2::regclass, attnum, $3)
			ORDER BY attnum`, role, table, p)
		if err != nil {
			t.Fatal(err)
		}
		cols, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		if len(cols) > 0 {
			out = append(out, p+"("+strings.Join(cols, ", ")+")")
		}
	}
	return strings.Join(out, ", ")
}

func roleConst(role string) string {
	return map[string]string{api: "api", relay: "relay", consumer: "consumer", operator: "operator"}[role]
}

// A statement that a role runs (allowed) or is refused (SQLSTATE 42501,
// insufficient_privilege).
type probe struct {
	role    string
	sql     string
	allowed bool
}

// Each role is refused what its process never does, on the real server,
// as the role (SET ROLE in the superuser's session); the statements it
// needs go through. A refused statement fails before it touches a row, so
// the probes run on an empty database and roll back.
func TestRolesAreRefusedOutsideTheirGrants(t *testing.T) {
	t.Parallel()
	db := testenv.NewDatabase(t, migrations.Schemas...)
	const (
		anOutboxRow = `INSERT INTO message_outbox (outbox_id, aggregate_type, aggregate_id, message_type, message_version, exchange_name, routing_key, payload)
			VALUES (gen_random_uuid(), 'order', 'x', 'order.submitted', 1, 'orders', 'order.submitted', '{}')`
		anInboxRow = `INSERT INTO message_inbox (consumer_name, message_id, message_type, message_version, status, payload_hash)
			VALUES ('c', 'm', 'order.submitted', 1, 'PROCESSED', 'h')`
		anOrder = `INSERT INTO orders (order_id, customer_id, currency, status, total_cents)
			VALUES (gen_random_uuid(), 'c', 'EUR', 'SUBMITTED', 1)`
	)
	probes := []probe{
		// The relay: the outbox and nothing else.
		{relay, `SELECT order_id FROM orders`, false},
		{relay, `UPDATE orders SET status = 'CANCELLED' WHERE false`, false},
		{relay, anOrder, false},
		{relay, `SELECT message_id FROM message_inbox`, false},
		{relay, `SELECT request_hash FROM http_idempotency_key`, false},
		{relay, anOutboxRow, false}, // it publishes messages, it never writes one
		{relay, `UPDATE message_outbox SET payload = '{}' WHERE false`, false},
		{relay, `TRUNCATE message_outbox`, false},
		{relay, `SELECT outbox_id, payload FROM message_outbox WHERE status = 'PENDING' FOR UPDATE SKIP LOCKED`, true},
		{relay, `UPDATE message_outbox SET status = 'PUBLISHED', published_at = now(), claimed_by = NULL, claimed_until = NULL WHERE false`, true},
		{relay, `DELETE FROM message_outbox WHERE status = 'PUBLISHED'`, true},
		{relay, `LISTEN message_outbox`, true},

		// The API: never reads the inbox or the outbox (every column of
		// each is probed below), writes its messages to the outbox, and
		// sees one order's messages through the timeline's functions.
		{api, `SELECT * FROM message_inbox`, false},
		{api, `SELECT count(*) FROM message_inbox`, false},
		{api, `SELECT consumer_name, status, outcome, last_error_message FROM message_inbox WHERE aggregate_id = 'x'`, false},
		{api, anInboxRow, false},
		{api, `UPDATE message_inbox SET status = 'PROCESSED' WHERE false`, false},
		{api, `SELECT * FROM message_outbox`, false},
		{api, `SELECT count(*) FROM message_outbox`, false},
		{api, `INSERT INTO message_outbox (outbox_id, aggregate_type, aggregate_id, message_type, message_version, exchange_name, routing_key, payload)
			VALUES (gen_random_uuid(), 'order', 'x', 'order.submitted', 1, 'orders', 'order.submitted', '{}') RETURNING status`, false},
		{api, `UPDATE message_outbox SET status = 'PUBLISHED' WHERE false`, false},
		{api, `DELETE FROM message_outbox WHERE false`, false},
		{api, `DELETE FROM orders WHERE false`, false},
		{api, `UPDATE orders SET total_cents = 0 WHERE false`, false},
		{api, `SELECT order_id FROM stock_reservation`, false},
		{api, `SELECT order_id FROM shipment`, false},
		{api, `SELECT actor FROM operator_audit`, false},
		{api, anOrder, true},
		{api, anOutboxRow, true},
		{api, `SELECT * FROM inbox_rows_of_aggregate('x')`, true},
		{api, `SELECT * FROM outbox_messages_of_aggregate('order', 'x')`, true},
		{api, `SELECT pg_try_advisory_xact_lock(hashtextextended('k', 0))`, true},

		// The consumer: never an order's customer or amounts, never the API's
		// idempotency keys, the outbox only to write follow-ups.
		{consumer, `DELETE FROM orders WHERE false`, false},
		{consumer, `SELECT customer_id FROM orders`, false},
		{consumer, `UPDATE orders SET total_cents = 0 WHERE false`, false},
		{consumer, anOrder, false},
		{consumer, `SELECT request_hash FROM http_idempotency_key`, false},
		{consumer, `DELETE FROM http_idempotency_key WHERE false`, false},
		{consumer, `INSERT INTO http_idempotency_key (request_method, request_path, idempotency_key, request_hash) VALUES ('POST', '/', 'k', 'h')`, false},
		{consumer, `SELECT payload FROM message_outbox`, false},
		{consumer, `UPDATE message_outbox SET status = 'PENDING' WHERE false`, false},
		{consumer, `DELETE FROM order_state_transition WHERE false`, false},
		{consumer, `SELECT shipment_id FROM shipment`, false},
		{consumer, `SELECT actor FROM operator_audit`, false},
		{consumer, `SELECT status FROM orders WHERE order_id = gen_random_uuid() FOR UPDATE`, true},
		{consumer, anInboxRow, true},
		{consumer, anOutboxRow, true},
		{consumer, `INSERT INTO shipment (shipment_id, order_id, status, message_id) VALUES (gen_random_uuid(), gen_random_uuid(), 'READY_TO_SHIP', 'm')
			ON CONFLICT (order_id) DO NOTHING`, true},

		// The operator: reads everything, changes only what orderctl does.
		{operator, `UPDATE orders SET status = 'CANCELLED' WHERE false`, false},
		{operator, `DELETE FROM orders WHERE false`, false},
		{operator, anOrder, false},
		{operator, anOutboxRow, false},
		{operator, `UPDATE message_outbox SET payload = '{}' WHERE false`, false},
		{operator, `UPDATE message_outbox SET status = 'PUBLISHED', claimed_by = 'me' WHERE false`, false},
		{operator, `UPDATE message_inbox SET status = 'PROCESSED' WHERE false`, false},
		{operator, `UPDATE operator_audit SET reason = 'nothing happened' WHERE false`, false}, // the audit is append-only
		{operator, `DELETE FROM operator_audit WHERE false`, false},
		{operator, `SELECT * FROM orders, message_outbox, message_inbox, http_idempotency_key, operator_audit`, true},
		{operator, `UPDATE message_outbox SET status = 'PENDING', attempt_count = 0, next_attempt_at = now() WHERE status = 'FAILED'`, true},
		{operator, `INSERT INTO operator_audit (actor, action, target, reason) VALUES ('t', 'test', 'x', 'a test') RETURNING audit_id, at`, true},
	}
	for _, table := range []string{"message_inbox", "message_outbox"} {
		for _, column := range columnsOf(t, db.Pool, table) {
			probes = append(probes, probe{api, "SELECT " + pgx.Identifier{column}.Sanitize() + " FROM " + table, false})
		}
	}
	for _, role := range []string{relay, consumer} {
		// The read functions are the API's and the operator's alone.
		probes = append(probes,
			probe{role, `SELECT * FROM inbox_rows_of_aggregate('x')`, false},
			probe{role, `SELECT * FROM outbox_messages_of_aggregate('order', 'x')`, false},
		)
	}
	for _, role := range migrations.Roles {
		// Nobody but the owner changes the schema, empties a table, or
		// draws from a sequence; nobody calls the trigger function.
		probes = append(probes,
			probe{role, `CREATE TABLE mine (id int)`, false},
			probe{role, `CREATE FUNCTION mine() RETURNS int LANGUAGE sql AS 'SELECT 1'`, false},
			probe{role, `TRUNCATE orders`, false},
			probe{role, `ALTER TABLE orders ADD COLUMN mine int`, false},
			probe{role, `SELECT nextval('operator_audit_audit_id_seq')`, false},
			probe{role, `SELECT version_id FROM goose_db_version`, false},
			probe{role, `SELECT message_outbox_notify()`, false},
		)
	}

	conn, err := pgx.Connect(t.Context(), db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.WithoutCancel(t.Context()))
	for _, p := range probes {
		err := asRole(t.Context(), conn, p.role, p.sql)
		var pgErr *pgconn.PgError
		refused := errors.As(err, &pgErr) && pgErr.Code == "42501"
		switch {
		case p.allowed && err != nil:
			t.Errorf("%s must be able to run %s, got %v", p.role, p.sql, err)
		case !p.allowed && !refused:
			t.Errorf("%s must be refused (42501) %s, got %v", p.role, p.sql, err)
		}
	}
}

// columnsOf lists the columns of table.
func columnsOf(t *testing.T, db database.DBTX, table string) []string {
	t.Helper()
	rows, err := db.Query(t.Context(), `SELECT attname FROM pg_attribute
		WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum`, table)
	if err != nil {
		t.Fatal(err)
	}
	cols, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if len(cols) == 0 {
		t.Fatalf("table %s has no columns", table)
	}
	return cols
}

// asRole runs sql as role in a transaction that it rolls back.
func asRole(ctx context.Context, conn *pgx.Conn, role, sql string) error {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, "SET LOCAL ROLE "+pgx.Identifier{role}.Sanitize()); err != nil {
		return fmt.Errorf("set role: %w", err)
	}
	_, err = tx.Exec(ctx, sql)
	return err
}

// Rolling the roles' migration back revokes every grant, gives the trigger function back PostgreSQL's
// default (PUBLIC may execute it), leaves the mechanisms' own functions to
// nobody and keeps the roles (other databases may
// use them); applying it again restores the matrices.
func TestRolesMigrationDownRevokesOnly(t *testing.T) {
	t.Parallel()
	db := testenv.NewDatabase(t, migrations.Schemas...)
	m, err := store.NewMigrator(db.Pool, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = m.Close() }()
	if err := m.DownTo(t.Context(), 7); err != nil {
		t.Fatal(err)
	}
	nothing := map[string]map[string]string{}
	for table := range grants {
		var exists bool // tables of later migrations are gone, grants and all
		if err := db.Pool.QueryRow(t.Context(), "SELECT to_regclass($1) IS NOT NULL", table).Scan(&exists); err != nil {
			t.Fatal(err)
		}
		if exists {
			nothing[table] = map[string]string{api: "", relay: "", consumer: "", operator: ""}
		}
	}
	checkGrants(t, db.Pool, nothing)
	everyone := map[string]string{api: "EXECUTE", relay: "EXECUTE", consumer: "EXECUTE", operator: "EXECUTE"}
	nobody := map[string]string{api: "", relay: "", consumer: "", operator: ""}
	checkFunctionGrants(t, db.Pool, map[string]map[string]string{
		"message_outbox_notify()":                                      everyone,
		"outbox_partition(text,integer)":                               nobody, // the mechanisms' own, revoked from PUBLIC there
		"inbox_time_partition_bounds()":                                nobody,
		"inbox_create_time_partitions(text,integer)":                   nobody,
		"inbox_time_partitions(interval,boolean)":                      nobody,
		"outbox_messages_of_aggregate(text,text)":                      nobody,
		"inbox_rows_of_aggregate(text)":                                nobody,
		"inbox_rows_of_aggregate_since(text,timestamp with time zone)": nobody,
	})
	var roles int
	if err := db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_roles WHERE rolname = ANY ($1)`, migrations.Roles).Scan(&roles); err != nil || roles != len(migrations.Roles) {
		t.Fatalf("after down: %d of the %d roles left, %v", roles, len(migrations.Roles), err)
	}
	if err := m.Up(t.Context()); err != nil {
		t.Fatal(err)
	}
	checkGrants(t, db.Pool, grants)
	checkFunctionGrants(t, db.Pool, functionGrants)
}

// The block that creates the roles tolerates other sessions creating the
// same roles at the same time (databases of one server migrated together,
// as the tests do): sessions that find a role missing, while the first one
// has created it and not committed yet, wait for it and go on. The block
// of 00008_roles.sql runs as written, for roles of this test's own.
func TestRolesBlockToleratesConcurrentCreation(t *testing.T) {
	t.Parallel()
	db := testenv.NewDatabase(t, migrations.Schemas...)
	src, err := fs.ReadFile(migrations.FS, "00008_roles.sql")
	if err != nil {
		t.Fatal(err)
	}
	_, block, _ := strings.Cut(string(src), "-- +goose StatementBegin\n")
	block, _, _ = strings.Cut(block, "-- +goose StatementEnd")
	const names = `ARRAY['orders_api', 'orders_relay', 'orders_consumer', 'orders_operator']`
	if !strings.Contains(block, names) {
		t.Fatalf("00008_roles.sql: no %s in the DO block:\n%s", names, block)
	}
	suffix := fmt.Sprint(time.Now().UnixNano())
	mine := []string{"orders_test_role_a_" + suffix, "orders_test_role_b_" + suffix}
	block = strings.Replace(block, names, fmt.Sprintf("ARRAY['%s', '%s']", mine[0], mine[1]), 1)
	t.Cleanup(func() {
		ctx := context.Background()
		conn, err := pgx.Connect(ctx, db.URL)
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close(ctx)
		for _, r := range mine {
			if _, err := conn.Exec(ctx, "DROP ROLE IF EXISTS "+pgx.Identifier{r}.Sanitize()); err != nil {
				t.Errorf("drop role %s: %v", r, err)
			}
		}
	})

	// The first session creates the roles and holds its transaction open
	// while the others run the block.
	ctx := t.Context()
	first, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = first.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := first.Exec(ctx, block); err != nil {
		t.Fatal(err)
	}
	runBeside(t, db, first, block)
	var n int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_roles WHERE rolname = ANY ($1) AND rolcanlogin`, mine).Scan(&n); err != nil || n != len(mine) {
		t.Fatalf("%d of %d login roles created, %v", n, len(mine), err)
	}
}

// The REPLICATION grant of 00015, and its revocation by 00019, run beside
// the same migrations of other databases on the server (a role belongs to
// the whole server): a session whose ALTER ROLE waited on another's and
// lost ("tuple concurrently updated") must not fail the migration, and
// must leave the role as its migration says. Each block runs here on a
// role of the test's own.
func TestReplicationGrantToleratesConcurrentMigrations(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		file, created, first string
		want                 bool
	}{
		// The first session grants too: the others find it done.
		{"00015_relay_replication.sql", "NOREPLICATION", "WITH REPLICATION", true},
		// The first session revokes too: the others look again.
		{"00019_relay_no_replication.sql", "REPLICATION", "WITH NOREPLICATION", false},
	} {
		t.Run(c.file+" "+c.first, func(t *testing.T) {
			t.Parallel()
			roleBlockBeside(t, c.file, c.created, c.first, c.want)
		})
	}
}

// roleBlockBeside runs the DO block of file, on a role of its own created
// with the attribute created, in sessions that wait on a first one's ALTER
// ROLE ... first, and checks the role's REPLICATION is want.
func roleBlockBeside(t *testing.T, file, created, first string, want bool) {
	db := testenv.NewDatabase(t, migrations.Schemas...)
	src, err := fs.ReadFile(migrations.FS, file)
	if err != nil {
		t.Fatal(err)
	}
	_, block, _ := strings.Cut(string(src), "-- +goose StatementBegin\n")
	block, _, _ = strings.Cut(block, "-- +goose StatementEnd")
	if strings.Count(block, "orders_relay") < 2 {
		t.Fatalf("%s: no orders_relay in the DO block:\n%s", file, block)
	}
	role := fmt.Sprint("orders_test_relay_", time.Now().UnixNano())
	block = strings.ReplaceAll(block, "orders_relay", role)
	ctx := t.Context()
	if _, err := db.Pool.Exec(ctx, "CREATE ROLE "+role+" NOLOGIN "+created); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := db.Pool.Exec(context.Background(), "DROP ROLE IF EXISTS "+role); err != nil {
			t.Errorf("drop role %s: %v", role, err)
		}
	})

	// The first session changes the role and holds its transaction open
	// while the others run the block: their ALTER ROLE waits on the first
	// one's, and finds the row changed once it commits.
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, "ALTER ROLE "+role+" "+first); err != nil {
		t.Fatal(err)
	}
	runBeside(t, db, tx, block)
	var replication bool
	if err := db.Pool.QueryRow(ctx, "SELECT rolreplication FROM pg_roles WHERE rolname = $1", role).Scan(&replication); err != nil || replication != want {
		t.Fatalf("the role's REPLICATION after the block: %v, %v; want %v", replication, err, want)
	}
}

// runBeside runs block in three sessions of their own while first holds
// its transaction open, lets them reach the wait on first's uncommitted
// change, commits first, and fails t for each session whose block failed.
func runBeside(t *testing.T, db *testenv.Database, first pgx.Tx, block string) {
	t.Helper()
	ctx := t.Context()
	const others = 3
	var wg sync.WaitGroup
	errs := make(chan error, others)
	for range others {
		wg.Go(func() {
			conn, err := pgx.Connect(ctx, db.URL)
			if err != nil {
				errs <- err
				return
			}
			defer conn.Close(context.WithoutCancel(ctx))
			_, err = conn.Exec(ctx, block)
			errs <- err
		})
	}
	testenv.WaitFor(t, 10*time.Second, "the other sessions to wait for the first", func() bool {
		var waiting int
		_ = db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND wait_event_type = 'Lock'`, db.Name).Scan(&waiting)
		return waiting == others
	})
	if err := first.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("a session that ran the block beside another: %v", err)
		}
	}
}
