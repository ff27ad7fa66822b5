package messaging

import amqp "github.com/rabbitmq/amqp091-go"

// The envelope of every message (docs/messaging.md, "Message contract"): AMQP
// properties message_id, type, content_type, delivery_mode, timestamp,
// correlation_id and app_id, and these headers. The outbox keeps the same
// names in its rows' headers column, so that a row reads like the message
// it becomes.
const (
	// HeaderMessageVersion is the payload's schema version (an integer).
	HeaderMessageVersion = "message_version"
	// HeaderCausationID is the message_id of the message whose handling
	// emitted this one; absent when an HTTP request did.
	HeaderCausationID = "causation_id"
	// HeaderCorrelationID is the correlation id. On the wire it is the AMQP
	// correlation_id property; in an outbox row, this header.
	HeaderCorrelationID = "correlation_id"
	// HeaderProducer names the process that wrote the message. On the wire
	// it is the AMQP app_id property; in an outbox row, this header.
	HeaderProducer = "app_id"
	// HeaderTraceparent and HeaderTracestate carry the W3C trace context.
	HeaderTraceparent = "traceparent"
	HeaderTracestate  = "tracestate"
)

// ContentTypeJSON is the content type of every message body.
const ContentTypeJSON = "application/json"

// HeaderString reads a string header, or "".
func HeaderString(h amqp.Table, key string) string {
	s, _ := h[key].(string)
	return s
}
