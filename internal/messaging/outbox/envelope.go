package outbox

import (
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/yourorg/orders/internal/messaging/outbox/internal/pipeline"
)

// Publishing builds the AMQP message of an outbox row: its envelope
// (docs/messaging.md). The message_id is the row's id on every attempt, so
// consumers can deduplicate; the timestamp is when the row was written; the
// headers of the row (trace context, correlation and causation ids) travel
// as AMQP headers, except the producer, which becomes the app_id.
func Publishing(row Row) amqp.Publishing { return pipeline.Publishing(row) }
