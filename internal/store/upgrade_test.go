package store_test

import (
	"embed"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/yourorg/orders/migrations"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/store"
	"github.com/yourorg/orders/internal/testenv"
)

// migrationsF03c365 is migrations/ as it was before the outbox and the
// inbox had migrations of their own (commit f03c365): one sequence, whose
// versions 2, 3, 11, 14 and 15 made the mechanisms' tables.
//
//go:embed testdata/migrations-f03c365/*.sql
var migrationsF03c365 embed.FS

// A database migrated before the mechanisms owned their schemas upgrades
// with nothing lost: every row stays as it was, in every state, and the
// schema (tables, indexes, triggers, functions, grants, the publication)
// ends up exactly a new database's, with the same versions recorded. The
// upgraded database then rolls all the way back like a new one.
func TestUpgradeFromOneSequence(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	pool := newEmptyDatabase(t)

	old, err := fs.Sub(migrationsF03c365, "testdata/migrations-f03c365")
	if err != nil {
		t.Fatal(err)
	}
	before, err := database.NewMigrator(pool, logger, database.Schema{Name: "orders", FS: old, VersionTable: "goose_db_version"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = before.Close() }()
	if err := before.Up(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, everyState); err != nil {
		t.Fatal(err)
	}
	columns := tableColumns(t, pool)
	rows := tableRows(t, pool, columns)

	m, err := store.NewMigrator(pool, logger)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = m.Close() }()
	for range 2 { // the second finds nothing to do
		if err := m.Up(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if got := tableRows(t, pool, columns); got != rows {
		t.Fatalf("rows after the upgrade:\n%s\nwant\n%s", got, rows)
	}

	fresh := testenv.NewDatabase(t, migrations.Schemas...)
	if got, want := versions(t, pool), versions(t, fresh.Pool); got != want {
		t.Errorf("versions recorded after the upgrade:\n%s\nwant a new database's\n%s", got, want)
	}
	if got, want := schemaDump(t, pool), schemaDump(t, fresh.Pool); got != want {
		t.Errorf("schema after the upgrade differs from a new database's:\n%s", lineDiff(got, want))
	}

	if err := m.DownTo(ctx, 0); err != nil {
		t.Fatal(err)
	}
	var left string
	if err := pool.QueryRow(ctx, `SELECT coalesce(string_agg(tablename, ', '), '') FROM pg_tables WHERE schemaname = 'public'
		AND tablename NOT LIKE '%version'`).Scan(&left); err != nil || left != "" {
		t.Fatalf("after rolling the upgraded database back: tables %q, %v", left, err)
	}
}

// everyState is a row in every state of every table: outbox rows pending,
// being published, published and failed, with partition leases; inbox rows
// of every status; an order in each status with its items and history;
// idempotency keys, the consumers' rows and an audit row.
const everyState = `
INSERT INTO orders (order_id, customer_id, currency, status, total_cents)
SELECT ('00000000-0000-0000-0000-00000000000' || n)::uuid, 'c-' || n, 'EUR', s, 100 * n
FROM unnest(ARRAY['SUBMITTED', 'FULFILLMENT_REQUESTED', 'FULFILLED', 'REJECTED', 'CANCELLED']) WITH ORDINALITY AS x(s, n);
INSERT INTO order_items (order_id, line_no, sku, quantity, unit_price_cents) SELECT order_id, 1, 'sku-1', 1, total_cents FROM orders;
INSERT INTO order_state_transition (order_id, from_status, to_status, message_id) SELECT order_id, NULL, status, 'm-' || order_id FROM orders;

INSERT INTO message_outbox (outbox_id, aggregate_type, aggregate_id, message_type, message_version, exchange_name, routing_key, payload,
    status, attempt_count, claimed_by, claimed_until, published_at, last_error)
VALUES
    (gen_random_uuid(), 'order', 'a', 'order.submitted', 1, 'orders.events', 'order.submitted', '{"n": 1}', 'PENDING', 0, NULL, NULL, NULL, NULL),
    (gen_random_uuid(), 'order', 'b', 'order.submitted', 1, 'orders.events', 'order.submitted', '{"n": 2}', 'PUBLISHING', 1, 'relay-1', now() + interval '1 minute', NULL, NULL),
    (gen_random_uuid(), 'order', 'c', 'order.cancelled', 2, 'orders.events', 'order.cancelled', '{"n": 3}', 'PUBLISHED', 1, NULL, NULL, now(), NULL),
    (gen_random_uuid(), 'order', 'd', 'order.submitted', 1, 'orders.events', 'order.submitted', '{"n": 4}', 'FAILED', 10, NULL, NULL, NULL, 'returned: NO_ROUTE');
INSERT INTO outbox_partition_lease (partition_no, relay_id, lease_until) VALUES (0, 'relay-1', now() + interval '1 minute'), (1, NULL, '-infinity');

INSERT INTO message_inbox (consumer_name, message_id, message_type, message_version, aggregate_id, status, outcome, outcome_reason,
    attempt_count, payload_hash, processed_at, last_error_code, last_error_message)
VALUES
    ('fulfillment', 'm-1', 'order.submitted', 1, 'a', 'PROCESSING', NULL, NULL, 1, 'h1', NULL, NULL, NULL),
    ('fulfillment', 'm-2', 'order.submitted', 1, 'b', 'PROCESSED', 'APPLIED', NULL, 1, 'h2', now(), NULL, NULL),
    ('fulfillment', 'm-3', 'order.cancelled', 1, 'c', 'PROCESSED', 'IGNORED', 'already cancelled', 1, 'h3', now(), NULL, NULL),
    ('notification', 'm-4', 'order.submitted', 1, 'd', 'RETRYABLE_FAILED', NULL, NULL, 2, 'h4', NULL, 'transient', 'connection reset'),
    ('notification', 'm-5', 'order.submitted', 1, 'e', 'PERMANENT_FAILED', NULL, NULL, 1, 'h5', NULL, 'invalid', 'bad payload'),
    ('warehouse', 'm-6', 'order.submitted', 1, 'f', 'POISONED', NULL, NULL, 5, 'h6', NULL, 'transient', 'timeout');

INSERT INTO http_idempotency_key (caller_role, caller, request_method, request_path, idempotency_key, request_hash, response_status)
VALUES ('customer', 'c-1', 'POST', '/v1/orders', 'k-1', 'rh', 201), ('operator', 'ops', 'POST', '/v1/orders', 'k-2', 'rh', NULL);
INSERT INTO stock_reservation (order_id, reservation_id, status, message_id)
VALUES ('00000000-0000-0000-0000-000000000001', gen_random_uuid(), 'RESERVED', 'm-1');
INSERT INTO customer_notification (notification_id, order_id, kind, status, message_id)
VALUES (gen_random_uuid(), '00000000-0000-0000-0000-000000000001', 'submitted', 'SENT', 'm-1');
INSERT INTO shipment (shipment_id, order_id, status, message_id, reservation_id)
VALUES (gen_random_uuid(), '00000000-0000-0000-0000-000000000003', 'READY_TO_SHIP', 'm-3', gen_random_uuid());
INSERT INTO operator_audit (actor, action, target, reason) VALUES ('ops', 'outbox.retry', 'x', 'a test');
`

// newEmptyDatabase creates a database with nothing in it, dropped when t
// ends.
func newEmptyDatabase(t *testing.T) *pgxpool.Pool {
	t.Helper()
	name := testenv.TestDatabaseName()
	testenv.DropDatabaseAtCleanup(t, name)
	url := testenv.ServerURL(t, name)
	if err := store.EnsureDatabase(t.Context(), url); err != nil {
		t.Fatal(err)
	}
	pool, err := database.NewPool(t.Context(), database.PoolConfig{URL: url})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// tableColumns is the columns of every table but the version tables, in
// their order, table by table.
func tableColumns(t *testing.T, pool *pgxpool.Pool) map[string][]string {
	t.Helper()
	tables := queryStrings(t, pool, `SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND tablename NOT LIKE '%version' ORDER BY 1`)
	columns := make(map[string][]string, len(tables))
	for _, table := range tables {
		columns[table] = queryStrings(t, pool, `SELECT column_name::text FROM information_schema.columns
			WHERE table_schema = 'public' AND table_name = '`+table+`' ORDER BY ordinal_position`)
	}
	return columns
}

// tableRows is every row of each table of columns, as text, table by
// table: the values of the columns given, those the tables had before an
// upgrade (a column the upgrade adds is not in the rows that were there;
// one it drops fails the query).
func tableRows(t *testing.T, pool *pgxpool.Pool, columns map[string][]string) string {
	t.Helper()
	var out strings.Builder
	for _, table := range slices.Sorted(maps.Keys(columns)) {
		cols := make([]string, len(columns[table]))
		for i, c := range columns[table] {
			cols[i] = pgx.Identifier{c}.Sanitize()
		}
		query := "SELECT ROW(" + strings.Join(cols, ", ") + ")::text FROM " + pgx.Identifier{table}.Sanitize() + " ORDER BY 1"
		for _, row := range queryStrings(t, pool, query) {
			out.WriteString(table + " " + row + "\n")
		}
	}
	if !strings.Contains(out.String(), "POISONED") {
		t.Fatalf("no rows in the tables:\n%s", out.String())
	}
	return out.String()
}

// versions is the versions each version table records as applied.
func versions(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	var out strings.Builder
	for _, table := range queryStrings(t, pool, `SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND tablename LIKE '%version' ORDER BY 1`) {
		applied := queryStrings(t, pool, "SELECT version_id::text FROM "+pgx.Identifier{table}.Sanitize()+" WHERE is_applied ORDER BY version_id")
		out.WriteString(table + ": " + strings.Join(applied, ",") + "\n")
	}
	return out.String()
}

// schemaDump is pg_dump's --schema-only of the database of pool: tables,
// indexes, triggers, functions, grants and publications.
func schemaDump(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	if _, err := exec.LookPath("pg_dump"); err != nil {
		t.Skip("pg_dump is not installed: the schemas are not compared")
	}
	url := pool.Config().ConnConfig.ConnString()
	out, err := exec.CommandContext(t.Context(), "pg_dump", "--schema-only", "--dbname="+url).Output()
	if err != nil {
		t.Fatalf("pg_dump: %v", err)
	}
	// Newer pg_dumps fence the dump with a random key: not the schema.
	var lines []string
	for _, l := range strings.Split(string(out), "\n") {
		if !strings.HasPrefix(l, `\restrict `) && !strings.HasPrefix(l, `\unrestrict `) {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines, "\n")
}

func queryStrings(t *testing.T, pool *pgxpool.Pool, sql string) []string {
	t.Helper()
	rows, err := pool.Query(t.Context(), sql)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// lineDiff lists the lines only the upgraded database's dump has, and
// those only the new database's has.
func lineDiff(upgraded, fresh string) string {
	count := map[string]int{}
	for _, l := range strings.Split(upgraded, "\n") {
		count[l]++
	}
	for _, l := range strings.Split(fresh, "\n") {
		count[l]--
	}
	var out []string
	for l, n := range count {
		switch {
		case n > 0:
			out = append(out, "upgraded only: "+l)
		case n < 0:
			out = append(out, "new only:      "+l)
		}
	}
	slices.Sort(out)
	return strings.Join(out, "\n")
}
