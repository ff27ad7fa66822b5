package tablestats_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/messaging/outbox"
	"github.com/yourorg/orders/internal/messaging/tablestats"
	"github.com/yourorg/orders/internal/testenv"
)

func TestMain(m *testing.M) { testenv.VerifyNoLeaks(m) }

type testBundle struct {
	db     *testenv.Database
	reader *sdkmetric.ManualReader
}

// setup makes a database with the outbox's table, and the gauges of that
// table registered on a reader of the test's own, reading as role ("" for
// the owner).
func setup(t *testing.T, role string) testBundle {
	t.Helper()
	db := testenv.NewDatabase(t, outbox.Schema)
	pool := db.Pool
	if role != "" {
		pool = newPool(t, db.URLAs(role))
	}
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	if err := tablestats.Register(mp.Meter("test"), pool, outbox.TableName); err != nil {
		t.Fatal(err)
	}
	return testBundle{db: db, reader: reader}
}

// gauge returns the values of a gauge by the value of label, after one
// collection.
func (b testBundle) gauge(t *testing.T, name, label string) map[string]float64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := b.reader.Collect(t.Context(), &rm); err != nil {
		t.Fatalf("collect: %v", err)
	}
	out := map[string]float64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			switch data := m.Data.(type) {
			case metricdata.Gauge[int64]:
				for _, p := range data.DataPoints {
					v, _ := p.Attributes.Value(attribute.Key(label))
					out[v.AsString()] = float64(p.Value)
				}
			case metricdata.Gauge[float64]:
				for _, p := range data.DataPoints {
					v, _ := p.Attributes.Value(attribute.Key(label))
					out[v.AsString()] = p.Value
				}
			default:
				t.Fatalf("%s is a %T, not a gauge", name, m.Data)
			}
		}
	}
	return out
}

// exec runs statements on a connection of their own, then has the
// backend report its table statistics (which it does at most once a
// second otherwise): before the next statement of any session, such as a
// VACUUM, whose figures the late report would add to.
func exec(t *testing.T, url string, statements ...string) {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	for _, sql := range append(statements, "SELECT pg_stat_force_next_flush()") {
		if _, err := conn.Exec(t.Context(), sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
}

const insertRows = `INSERT INTO message_outbox (outbox_id, aggregate_type, aggregate_id, message_type, message_version, exchange_name, routing_key, payload, headers)
	SELECT gen_random_uuid(), 'order', 'o-' || n, 'order.submitted', 1, 'orders.events', 'order.submitted', '{}', '{}'
	FROM generate_series(1, 300) AS n`

// Rows updated and deleted leave dead tuples, and the gauge rises with
// them; a vacuum takes them away and starts the time since it.
func TestDeadTuplesRiseAndVacuumClearsThem(t *testing.T) {
	t.Parallel()
	b := setup(t, "")
	if dead := b.gauge(t, "db.table.dead_tuples", "table")[outbox.TableName]; dead != 0 {
		t.Fatalf("a fresh table has %v dead tuples", dead)
	}
	if _, vacuumed := b.gauge(t, "db.table.vacuum_age", "table")[outbox.TableName]; vacuumed {
		t.Fatal("a table never vacuumed reports a vacuum age")
	}

	// The update and the delete in one transaction: no page is pruned of
	// the dead tuples before they are counted.
	exec(t, b.db.URL, insertRows, "BEGIN",
		`UPDATE message_outbox SET status = 'PUBLISHED', published_at = now() WHERE aggregate_id < 'o-2'`, // o-1, o-1x, o-1xx: 111 rows
		`DELETE FROM message_outbox WHERE aggregate_id >= 'o-3'`,                                          // o-3 to o-9, o-30 to o-99, o-300: 78 rows
		"COMMIT")
	testenv.WaitFor(t, 30*time.Second, "the dead tuples of 111 updates and 78 deletes", func() bool {
		return b.gauge(t, "db.table.dead_tuples", "table")[outbox.TableName] == 111+78
	})
	if live := b.gauge(t, "db.table.live_tuples", "table")[outbox.TableName]; live != 300-78 {
		t.Errorf("live tuples %v, want %d", live, 300-78)
	}
	for _, name := range []string{"db.table.size", "db.table.index_size"} {
		if size := b.gauge(t, name, "table")[outbox.TableName]; size < 8192 {
			t.Errorf("%s = %v, want at least a page", name, size)
		}
	}

	exec(t, b.db.URL, "VACUUM message_outbox")
	testenv.WaitFor(t, 30*time.Second, "the vacuum to be seen", func() bool {
		age, vacuumed := b.gauge(t, "db.table.vacuum_age", "table")[outbox.TableName]
		return vacuumed && age < 60 && b.gauge(t, "db.table.dead_tuples", "table")[outbox.TableName] == 0
	})
}

// A partitioned table's figures are its partitions', summed.
func TestTablesSumPartitions(t *testing.T) {
	t.Parallel()
	db := testenv.NewDatabase(t, outbox.Schema)
	exec(t, db.URL,
		`CREATE TABLE events (id int PRIMARY KEY, at int NOT NULL) PARTITION BY RANGE (id)`,
		`CREATE TABLE events_1 PARTITION OF events FOR VALUES FROM (0) TO (100)`,
		`CREATE TABLE events_2 PARTITION OF events FOR VALUES FROM (100) TO (200) PARTITION BY RANGE (id)`,
		`CREATE TABLE events_2a PARTITION OF events_2 FOR VALUES FROM (100) TO (200)`,
		`INSERT INTO events SELECT n, n FROM generate_series(0, 199) AS n`,
		`DELETE FROM events WHERE id % 10 = 0`) // 10 from each leaf
	exec(t, db.URL, `VACUUM events_1`)
	var got tablestats.Table
	testenv.WaitFor(t, 30*time.Second, "the partitions' statistics", func() bool {
		tables, err := tablestats.Tables(t.Context(), db.Pool, "events", "no_such_table")
		if err != nil {
			t.Fatal(err)
		}
		if len(tables) != 1 {
			t.Fatalf("tables %+v, want events alone", tables)
		}
		got = tables[0]
		return got.LiveTuples == 180 && got.DeadTuples == 10
	})
	if got.Partitions != 3 || got.TableBytes < 2*8192 || got.IndexBytes < 2*8192 {
		t.Errorf("events: %+v; want 3 partitions, the leaves' pages and indexes", got)
	}
	// events_2a holds rows and was never vacuumed.
	if got.Vacuumed {
		t.Errorf("events: vacuumed %s ago, but events_2a never was", got.SinceVacuum)
	}
	exec(t, db.URL, "VACUUM events_2a")
	testenv.WaitFor(t, 30*time.Second, "the second vacuum", func() bool {
		tables, err := tablestats.Tables(t.Context(), db.Pool, "events")
		return err == nil && tables[0].Vacuumed && tables[0].DeadTuples == 0
	})
}

// A session idle in transaction with an xid holds the horizon: it is the
// oldest holder, a session, with its application_name, state and age, and
// the gauge of its kind shows that age, as it does to a role with nothing
// but pg_read_all_stats. Once it commits, nothing holds the horizon.
func TestIdleInTransactionHoldsTheHorizon(t *testing.T) {
	t.Parallel()
	b := setup(t, "")
	reader := b.db.NewRole(t, "GRANT pg_read_all_stats TO %s")
	readerPool := newPool(t, b.db.URLAs(reader))

	holder := hold(t, b.db.URL, "tablestats-holder")
	time.Sleep(1100 * time.Millisecond)

	for _, db := range []tablestats.DB{b.db.Pool, readerPool} {
		holders, err := tablestats.Horizon(t.Context(), db)
		if err != nil {
			t.Fatal(err)
		}
		if len(holders) == 0 {
			t.Fatal("nothing holds the horizon")
		}
		h := holders[0]
		if h.Kind != tablestats.KindSession || h.Name != "tablestats-holder" || h.State != "idle in transaction" ||
			!h.AgeKnown || h.Age < time.Second || h.PID == 0 || h.XID == 0 {
			t.Errorf("oldest holder %+v; want the session tablestats-holder, idle in transaction, at least 1s old", h)
		}
	}
	ages := b.gauge(t, "db.xmin_horizon.age", "kind")
	if ages["session"] < 1 || ages["slot"] != 0 || ages["prepared"] != 0 || len(ages) != 3 {
		t.Errorf("db.xmin_horizon.age %v; want session at least 1s, slot and prepared 0", ages)
	}

	if err := holder.Commit(t.Context()); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 15*time.Second, "the horizon to be released", func() bool {
		return b.gauge(t, "db.xmin_horizon.age", "kind")["session"] == 0
	})
}

// A role that may not see another role's sessions cannot say what holds
// the horizon, and says so rather than report too young a horizon. It
// reads the tables' figures without any grant.
func TestHorizonNeedsReadAllStats(t *testing.T) {
	t.Parallel()
	db := testenv.NewDatabase(t, outbox.Schema)
	role := db.NewRole(t)
	pool := newPool(t, db.URLAs(role))
	hold(t, db.URL, "tablestats-holder")

	if _, err := tablestats.Horizon(t.Context(), pool); !errors.Is(err, tablestats.ErrHidden) {
		t.Errorf("Horizon as %s: %v, want ErrHidden", role, err)
	}
	tables, err := tablestats.Tables(t.Context(), pool, outbox.TableName)
	if err != nil || len(tables) != 1 {
		t.Errorf("Tables as %s: %+v, %v", role, tables, err)
	}
}

// hold opens a transaction with an xid on a session named appName, and
// rolls it back when the test ends.
func hold(t *testing.T, url, appName string) pgx.Tx {
	t.Helper()
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["application_name"] = appName
	conn, err := pgx.ConnectConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	tx, err := conn.BeginTx(t.Context(), pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(t.Context(), "SELECT txid_current()"); err != nil {
		t.Fatal(err)
	}
	return tx
}

// newPool opens a pool on url, closed when the test ends.
func newPool(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	p, err := database.NewPool(t.Context(), database.PoolConfig{URL: url})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// A quiet partition (vacuumed and analyzed, nothing written since) is
// sized from pg_class, as its vacuum counted it: its files, but for the
// free space and visibility maps. Once written to, its files are read
// again, exactly.
func TestQuietPartitionsAreSizedFromTheirLastVacuum(t *testing.T) {
	t.Parallel()
	db := testenv.NewDatabase(t, outbox.Schema)
	exec(t, db.URL,
		`CREATE TABLE history (id int PRIMARY KEY, note text NOT NULL) PARTITION BY RANGE (id)`,
		`CREATE TABLE history_1 PARTITION OF history FOR VALUES FROM (0) TO (10000)`,
		`CREATE INDEX ON history (note)`,
		`INSERT INTO history SELECT n, repeat('x', 100) FROM generate_series(0, 4999) AS n`)
	exec(t, db.URL, `VACUUM (ANALYZE) history_1`) // after the insert's counts are in
	files := func(mapsToo bool) (table, index int64) {
		t.Helper()
		q := `SELECT pg_table_size('history_1') - pg_relation_size('history_1', 'fsm') - pg_relation_size('history_1', 'vm'), pg_indexes_size('history_1')`
		if mapsToo {
			q = `SELECT pg_table_size('history_1'), pg_indexes_size('history_1')`
		}
		if err := db.Pool.QueryRow(t.Context(), q).Scan(&table, &index); err != nil {
			t.Fatal(err)
		}
		return table, index
	}
	read := func() tablestats.Table {
		t.Helper()
		tables, err := tablestats.Tables(t.Context(), db.Pool, "history")
		if err != nil || len(tables) != 1 {
			t.Fatalf("tables %+v, %v", tables, err)
		}
		return tables[0]
	}
	table, index := files(false)
	testenv.WaitFor(t, 30*time.Second, "the quiet partition's sizes from pg_class", func() bool {
		got := read()
		return got.TableBytes == table && got.IndexBytes == index
	})
	if table, _ := files(true); table == read().TableBytes {
		t.Fatalf("history_1: the sizes include its maps (%d bytes): not read from pg_class", table)
	}

	exec(t, db.URL, `INSERT INTO history SELECT n, repeat('y', 100) FROM generate_series(5000, 9999) AS n`)
	table, index = files(true)
	testenv.WaitFor(t, 30*time.Second, "the written partition's sizes from its files", func() bool {
		got := read()
		return got.TableBytes == table && got.IndexBytes == index
	})
}
