package store_test

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/store"
	"github.com/yourorg/orders/internal/testenv"
)

// The migrations go up, all the way down and up again on an empty
// database, which migrate creates first.
func TestMigrationsUpDownUp(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	name := testenv.TestDatabaseName()
	testenv.DropDatabaseAtCleanup(t, name)
	url := testenv.ServerURL(t, name)

	if err := store.EnsureDatabase(ctx, url); err != nil {
		t.Fatal(err)
	}
	if err := store.EnsureDatabase(ctx, url); err != nil { // idempotent
		t.Fatal(err)
	}
	pool, err := database.NewPool(ctx, database.PoolConfig{URL: url})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	m, err := store.NewMigrator(pool, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = m.Close() }()

	tables := func() string {
		var names []string
		rows, err := pool.Query(ctx, `SELECT tablename FROM pg_tables WHERE schemaname = 'public'
			AND tablename NOT IN ('goose_db_version', 'outbox_schema_version', 'inbox_schema_version') ORDER BY 1`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		for rows.Next() {
			var n string
			_ = rows.Scan(&n)
			names = append(names, n)
		}
		return strings.Join(names, ",")
	}
	// The tables of the contract, and any a consumer adds for itself.
	core := []string{"http_idempotency_key", "message_inbox", "message_outbox", "order_items", "order_state_transition", "orders"}

	if err := m.Up(ctx); err != nil {
		t.Fatal(err)
	}
	all := tables()
	for _, table := range core {
		if !slices.Contains(strings.Split(all, ","), table) {
			t.Fatalf("after up: %s, without %s", all, table)
		}
	}
	if err := m.DownTo(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if got := tables(); got != "" {
		t.Fatalf("after down: %s", got)
	}
	var functions int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_proc WHERE proname = 'message_outbox_notify'").Scan(&functions); err != nil || functions != 0 {
		t.Fatalf("notify function left behind: %d, %v", functions, err)
	}
	if err := m.Up(ctx); err != nil {
		t.Fatal(err)
	}
	if got := tables(); got != all {
		t.Fatalf("after up again: %s", got)
	}
	var status strings.Builder
	if err := m.Status(context.Background(), &status); err != nil || strings.Contains(status.String(), " pending\n") {
		t.Fatalf("status after up:\n%s%v", status.String(), err)
	}
}
