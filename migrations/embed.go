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
