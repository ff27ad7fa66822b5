package inbox

import "github.com/yourorg/orders/internal/messaging/inbox/migrations"

// Schema is the inbox's table (message_inbox), recorded in
// inbox_schema_version. Apply it with database.Migrator, after
// outbox.Schema (follow-up messages are outbox rows) and before the
// migrations of the service whose consumers use the inbox and grant on it.
var Schema = migrations.Schema

// TableName is the inbox's table, whose size and bloat the consumers
// report (internal/messaging/tablestats).
const TableName = "message_inbox"
