// Package migrations holds the outbox's tables as goose SQL migrations,
// numbered on their own: outbox.Schema applies them (database.Migrator).
package migrations

import "embed"

// FS holds the *.sql migrations, in goose's numbered order.
//
//go:embed *.sql
var FS embed.FS
