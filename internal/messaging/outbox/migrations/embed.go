// Package migrations holds the outbox's tables as goose SQL migrations,
// numbered on their own and recorded in outbox_schema_version: Schema,
// which package outbox exports as outbox.Schema.
package migrations

import (
	"embed"

	"github.com/yourorg/orders/internal/database"
)

// FS holds the *.sql migrations, in goose's numbered order.
//
//go:embed *.sql
var FS embed.FS

// Schema is the outbox's migrations for database.Migrator.
var Schema = database.Schema{Name: "outbox", FS: FS, VersionTable: "outbox_schema_version"}
