// Package migrations holds the inbox's table as goose SQL migrations,
// numbered on their own and recorded in inbox_schema_version: Schema,
// which package inbox exports as inbox.Schema.
package migrations

import (
	"embed"

	"github.com/yourorg/orders/internal/database"
)

// FS holds the *.sql migrations, in goose's numbered order.
//
//go:embed *.sql
var FS embed.FS

// Schema is the inbox's migrations for database.Migrator.
var Schema = database.Schema{Name: "inbox", FS: FS, VersionTable: "inbox_schema_version"}
