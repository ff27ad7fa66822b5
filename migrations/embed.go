// Package migrations holds the database schema as goose SQL migrations.
//
// The files are embedded in every binary (order-api migrate, or
// MIGRATE_ON_START=true) and are plain goose files, so `goose -dir migrations
// postgres "$DATABASE_URL" up` applies them just as well.
package migrations

import "embed"

// FS holds the *.sql migrations, in goose's numbered order.
//
//go:embed *.sql
var FS embed.FS

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
