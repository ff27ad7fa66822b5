package wal_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/yourorg/orders/internal/messaging"
	"github.com/yourorg/orders/internal/messaging/outbox"
	"github.com/yourorg/orders/internal/messaging/outbox/outboxtest"
	"github.com/yourorg/orders/internal/messaging/outbox/wal"
	"github.com/yourorg/orders/internal/testenv"
)

// Every goroutine a relay starts ends when it stops.
func TestMain(m *testing.M) { testenv.VerifyNoLeaks(m) }

// The relay's contract (package outboxtest), against the log-tailing
// relay.
func TestRelay(t *testing.T) {
	skipUnlessWAL(t)
	outboxtest.Run(t, walMode)
}

// walMode is the log-tailing relay, on a PostgreSQL of the test binary's
// own with wal_level=logical.
var walMode = outboxtest.Mode{
	Name: "wal",
	NewDatabase: func(t testing.TB) *testenv.Database {
		return testenv.LogicalPostgres(t).NewDatabase(t, outbox.Schema)
	},
	Prepare: func(b *outboxtest.Bundle) {
		// The slot is made now, before the test opens any transaction of
		// its own: making a logical slot waits for every transaction open
		// on the server, and a test that holds one open until its relay
		// publishes would wait for itself. (The server's other tests' open
		// transactions only delay it.) A relay makes its slot itself on its
		// first start, as in production, when it is missing
		// (TestWALSlotLostFallsBackToTheRows).
		if _, err := b.Pool.Exec(b.Ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", b.Slot); err != nil {
			b.T.Fatal(err)
		}
	},
	NewRelay: func(b *outboxtest.Bundle, cfg outbox.Config, deps messaging.Deps) (outboxtest.Relay, error) {
		return wal.NewRelay(cfg, testWALConfig(b), deps)
	},
}

// skipUnlessWAL skips a test that needs the logical server unless the run
// asks for it (OUTBOX_TEST_RELAY_MODE=wal: make test/wal).
func skipUnlessWAL(t testing.TB) {
	t.Helper()
	testenv.SkipUnlessWAL(t)
}

// setupRelay is outboxtest.Setup for the log-tailing relay.
func setupRelay(t testing.TB) *outboxtest.Bundle {
	t.Helper()
	skipUnlessWAL(t)
	return outboxtest.Setup(t, walMode)
}

// testWALConfig is fast: a heartbeat and position reports well under a
// second, and a short sweep delay. Its replication connection goes past
// the pooler, if the relays' pools go through one: PgBouncer carries no
// replication connection.
func testWALConfig(b *outboxtest.Bundle) wal.Config {
	return wal.Config{Slot: b.Slot, Heartbeat: 200 * time.Millisecond, SweepAfter: 5 * time.Second,
		StatusInterval: 100 * time.Millisecond, ReplicationURL: b.DirectURL}
}

// dropSlot drops a test's replication slot, ending the session that still
// streams it, if any.
func dropSlot(t testing.TB, pool *pgxpool.Pool, slot string) {
	ctx := context.Background()
	for try := 0; try < 50; try++ {
		_, _ = pool.Exec(ctx, "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL", slot)
		_, err := pool.Exec(ctx, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1", slot)
		if err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Errorf("replication slot %s could not be dropped", slot)
}
