package migrations_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/messaging/tablestats"
	"github.com/yourorg/orders/internal/testenv"
	"github.com/yourorg/orders/migrations"
)

// The processes that report the tables' bloat and the transaction horizon
// read them as their own roles (00022_read_all_stats.sql): the relay its
// outbox, the consumers their inbox, orderctl both, and each sees the
// session of another role (order-api's) that holds the horizon, by name
// and state. order-api, which reports neither, may not see it.
func TestProcessRolesSeeTheHorizon(t *testing.T) {
	t.Parallel()
	db := testenv.NewDatabase(t, migrations.Schemas...)
	ctx := t.Context()

	cfg, err := pgx.ParseConfig(db.URLAs(api))
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["application_name"] = "order-api-held"
	holder, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close(context.Background())
	tx, err := holder.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := tx.Exec(ctx, "SELECT count(*) FROM orders"); err != nil { // a snapshot
		t.Fatal(err)
	}

	for role, tables := range map[string][]string{
		relay:    {"message_outbox"},
		consumer: {"message_inbox"},
		operator: {"message_outbox", "message_inbox"},
	} {
		pool, err := database.NewPool(ctx, database.PoolConfig{URL: db.URLAs(role)})
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		got, err := tablestats.Tables(ctx, pool, tables...)
		if err != nil || len(got) != len(tables) {
			t.Errorf("%s: Tables(%v) = %+v, %v", role, tables, got, err)
		}
		holders, err := tablestats.Horizon(ctx, pool)
		if err != nil {
			t.Errorf("%s: Horizon: %v", role, err)
			continue
		}
		if len(holders) == 0 || holders[0].Kind != tablestats.KindSession || holders[0].Name != "order-api-held" ||
			holders[0].State != "idle in transaction" || !holders[0].AgeKnown {
			t.Errorf("%s: horizon %+v; want order-api's session first, idle in transaction", role, holders)
		}
	}

	pool, err := database.NewPool(ctx, database.PoolConfig{URL: db.URLAs(api)})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	// Its own session it may see: another role's holds the horizon too.
	other, err := pgx.Connect(ctx, db.URLAs(relay))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(context.Background())
	otherTx, err := other.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = otherTx.Rollback(context.Background()) }()
	if _, err := otherTx.Exec(ctx, "SELECT count(*) FROM message_outbox"); err != nil {
		t.Fatal(err)
	}
	if _, err := tablestats.Horizon(ctx, pool); !errors.Is(err, tablestats.ErrHidden) {
		t.Errorf("%s: Horizon: %v, want ErrHidden", api, err)
	}
}
