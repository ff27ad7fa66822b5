package testenv_test

import (
	"strings"
	"testing"

	"github.com/yourorg/orders/migrations"

	"github.com/jackc/pgx/v5"

	"github.com/yourorg/orders/internal/database"
	inbox "github.com/yourorg/orders/internal/messaging/inbox/migrations"
	outbox "github.com/yourorg/orders/internal/messaging/outbox/migrations"
	"github.com/yourorg/orders/internal/testenv"
)

// A database has the schemas it was asked for and nothing else (each
// from a template of its own), and the order service's without any.
func TestNewDatabaseOfSchemas(t *testing.T) {
	t.Parallel()
	tables := func(db *testenv.Database) string {
		// The tables, not their time partitions (of message_outbox).
		rows, err := db.Pool.Query(t.Context(), `SELECT relname FROM pg_class WHERE relnamespace = 'public'::regnamespace
			AND relkind IN ('r', 'p') AND NOT relispartition ORDER BY 1`)
		if err != nil {
			t.Fatal(err)
		}
		names, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return strings.Join(names, ",")
	}
	for _, c := range []struct {
		schemas []database.Schema
		want    string
	}{
		{[]database.Schema{outbox.Schema}, "message_outbox,outbox_partition_lease,outbox_relay,outbox_schema_version"},
		{[]database.Schema{outbox.Schema, inbox.Schema}, "inbox_schema_version,message_inbox,message_outbox,outbox_partition_lease,outbox_relay,outbox_schema_version"},
	} {
		if got := tables(testenv.NewDatabase(t, c.schemas...)); got != c.want {
			t.Errorf("tables of %d schemas: %s, want %s", len(c.schemas), got, c.want)
		}
	}
	if got := tables(testenv.NewDatabase(t, migrations.Schemas...)); !strings.Contains(got, "message_inbox") || !strings.Contains(got, "orders") {
		t.Errorf("tables of the order service's database: %s", got)
	}
}
