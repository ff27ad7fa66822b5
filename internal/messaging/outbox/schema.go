package outbox

import "github.com/yourorg/orders/internal/messaging/outbox/migrations"

// Schema is the outbox's tables (message_outbox, outbox_partition_lease)
// and the log-tailing relay's publication, recorded in
// outbox_schema_version. Apply it with database.Migrator before the
// migrations of the service that writes to the outbox and grants on it.
var Schema = migrations.Schema

// TableName is the outbox's table, whose size and bloat the relay reports
// (internal/messaging/tablestats).
const TableName = "message_outbox"
