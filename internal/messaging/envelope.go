package messaging

import (
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/yourorg/orders/internal/store"
)

// AMQP header names of the envelope (SPEC section 5).
const (
	HeaderMessageVersion = "message_version"
	HeaderCausationID    = store.HeaderCausationID
	HeaderCorrelationID  = store.HeaderCorrelationID
	HeaderTraceparent    = "traceparent"
	HeaderTracestate     = "tracestate"
)

// ContentTypeJSON is the content type of every message body.
const ContentTypeJSON = "application/json"

// Publishing builds the AMQP message of an outbox row. The message_id is
// the row's id on every attempt, so consumers can deduplicate; the
// timestamp is when the row was written; the headers of the row (trace
// context, correlation and causation ids) travel as AMQP headers.
func Publishing(row store.OutboxRow) amqp.Publishing {
	headers := amqp.Table{HeaderMessageVersion: int32(row.Version)}
	for k, v := range row.Headers {
		if k != store.HeaderProducer {
			headers[k] = v
		}
	}
	return amqp.Publishing{
		MessageId:     row.ID.String(),
		Type:          row.Type,
		ContentType:   ContentTypeJSON,
		DeliveryMode:  amqp.Persistent,
		Timestamp:     row.CreatedAt,
		CorrelationId: row.Headers[store.HeaderCorrelationID],
		AppId:         row.Headers[store.HeaderProducer],
		Headers:       headers,
		Body:          row.Payload,
	}
}
