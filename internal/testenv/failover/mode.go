package failover

import (
	"fmt"

	"github.com/yourorg/orders/internal/testenv"
	"github.com/yourorg/orders/migrations"
)

// Mode is the outbox-relay's RELAY_MODE under test: Poll or WAL.
type Mode string

// The relay modes.
const (
	// Poll claims PENDING rows with SELECT ... FOR UPDATE SKIP LOCKED.
	Poll Mode = "poll"
	// WAL tails the log through a logical replication slot, which the
	// cluster keeps as a Patroni permanent slot so that a new primary has
	// it.
	WAL Mode = "wal"
)

// Slot is the log-tailing relay's replication slot: its default name
// (RELAY_WAL_SLOT), the cluster being the caller's alone.
const Slot = "orders_outbox_relay"

// ParseMode reads "poll" or "wal".
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case Poll, WAL:
		return m, nil
	}
	return "", fmt.Errorf("relay mode %q: want poll or wal", s)
}

// Cluster is the Patroni cluster for the mode with the flow's database
// database: synchronous; for WAL, wal_level=logical and the relay's slot
// among Patroni's permanent slots, of type logical with pgoutput.
func (m Mode) Cluster(database string) testenv.PatroniOptions {
	if m != WAL {
		return testenv.PatroniOptions{}
	}
	return testenv.PatroniOptions{WALLevel: "logical", PermanentSlots: map[string]testenv.PatroniSlot{
		Slot: {Type: "logical", Database: database, Plugin: "pgoutput"},
	}}
}

// MigrateEnv is what order-api migrate up needs for the mode: for WAL,
// the replication role the relay streams as.
func (m Mode) MigrateEnv() []string {
	if m != WAL {
		return nil
	}
	return []string{"MIGRATE_RELAY_WAL_ROLE=true"}
}

// RelayEnv is the outbox-relay's environment for the mode, on the
// database of dbURL (the cluster's multi-host URL, as the superuser).
// The log-tailing relay streams Slot as orders_relay_wal, with a
// heartbeat of half a second and the default sweep delay, 30 s: a
// message the stream missed would be late by more than that, which the
// accounting sees.
func (m Mode) RelayEnv(dbURL string) []string {
	if m != WAL {
		return []string{"RELAY_MODE=poll"}
	}
	return []string{"RELAY_MODE=wal", "RELAY_WAL_SLOT=" + Slot,
		"RELAY_WAL_DATABASE_URL=" + testenv.AsRole(dbURL, migrations.RoleRelayWAL),
		"RELAY_WAL_HEARTBEAT=500ms", "RELAY_WAL_SWEEP_AFTER=30s"}
}

// ProcessEnv is the settings of the three processes beyond their
// defaults (besides each one's DATABASE_URL, AMQP_URL and addresses), in
// test/e2e and lab/failover: JSON logs, and the relay's and the
// consumer's retries short enough for a run of minutes.
var ProcessEnv = []string{"LOG_FORMAT=json",
	"RELAY_POLL_INTERVAL=200ms", "RELAY_BACKOFF_BASE=50ms", "RELAY_BACKOFF_MAX=500ms",
	"CONSUMER_RETRY_DELAYS=100ms,500ms", "CONSUMER_PROCESSING_LEASE=10s", "SHUTDOWN_TIMEOUT=5s"}
