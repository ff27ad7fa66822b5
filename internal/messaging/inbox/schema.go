package inbox

import (
	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/messaging/inbox/migrations"
)

// Schema is the inbox's table (message_inbox), recorded in
// inbox_schema_version. Apply it with database.Migrator before the
// migrations of the service whose consumers use the inbox and grant on it.
var Schema = database.Schema{Name: "inbox", FS: migrations.FS, VersionTable: "inbox_schema_version"}
