// Package migrations holds the order service's schema as goose SQL
// migrations: its tables, and the roles of its processes with their grants,
// on its own tables and on the outbox's and the inbox's, whose own
// migrations live with them (internal/messaging/outbox/migrations,
// internal/messaging/inbox/migrations).
//
// The files are embedded in every binary (order-api migrate, or
// MIGRATE_ON_START=true), which applies Schemas in order. They are plain
// goose files: `goose -dir migrations postgres "$DATABASE_URL" up` applies
// this directory, after the mechanisms' (each with -table, its
// VersionTable).
package migrations

import (
	"embed"

	"github.com/yourorg/orders/internal/database"
	inbox "github.com/yourorg/orders/internal/messaging/inbox/migrations"
	outbox "github.com/yourorg/orders/internal/messaging/outbox/migrations"
)

// FS holds the *.sql migrations, in goose's numbered order.
//
//go:embed *.sql
var FS embed.FS

// Schema is the service's own migrations, recorded in goose's default
// table.
var Schema = database.Schema{Name: "orders", FS: FS, VersionTable: "goose_db_version"}

// Schemas are the order service's database, in the order they apply: the
// mechanisms' tables first (outbox.Schema and inbox.Schema, taken from
// their migrations packages, so that this package, and internal/testenv
// with it, imports neither mechanism), then the service's, which grant on
// them.
var Schemas = []database.Schema{outbox.Schema, inbox.Schema, Schema}

// The roles of the processes (00008_roles.sql), one per process, each
// granted only what its process needs. docs/security.md has the matrix.
const (
	RoleAPI      = "orders_api"      // order-api
	RoleRelay    = "orders_relay"    // outbox-relay
	RoleConsumer = "orders_consumer" // order-consumer
	RoleOperator = "orders_operator" // orderctl, the walkthrough
)

// Roles are the process roles, in the order above.
var Roles = []string{RoleAPI, RoleRelay, RoleConsumer, RoleOperator}

// RoleRelayWAL is the log-tailing relay's replication role
// (RELAY_MODE=wal): LOGIN and REPLICATION, and no grant. Its replication
// connection alone uses it; the relay's other sessions are RoleRelay's,
// which keeps no REPLICATION (00019_relay_no_replication.sql). migrate
// makes it only when asked (store.RelayWALRole): REPLICATION reads every
// table (docs/security.md#replication).
const RoleRelayWAL = "orders_relay_wal"
