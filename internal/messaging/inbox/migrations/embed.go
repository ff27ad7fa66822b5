// Package migrations holds the inbox's table as goose SQL migrations,
// numbered on their own: inbox.Schema applies them (database.Migrator).
package migrations

import "embed"

// FS holds the *.sql migrations, in goose's numbered order.
//
//go:embed *.sql
var FS embed.FS
