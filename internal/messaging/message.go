package messaging

import (
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// Message is a payload the outbox writes and the inbox reads. Its JSON
// encoding is the message body; its type is the routing key. Each type has
// versions: a change old readers cannot ignore is a new version, with a
// new Go type, and readers keep the old one while old messages may still
// arrive or be replayed.
type Message interface {
	MessageType() string
	MessageVersion() int
	// AggregateID is the entity the message is about (an order's id): the
	// outbox row's aggregate_id, and what the inbox and the logs name.
	AggregateID() string
}

// Cause says what made a change and the messages it emits: the message
// being handled (MessageID, "" when a request made it), in the flow of a
// correlation id. Messages carry it as their causation_id and
// correlation_id, so that a reader can follow a flow from the request that
// began it, message by message.
type Cause struct {
	MessageID     string
	CorrelationID string
}

// Deps is what the relay and the consumers run on.
type Deps struct {
	Pool *pgxpool.Pool
	// AMQPURL is the broker (AMQP_URL).
	AMQPURL        string
	Logger         *slog.Logger
	MeterProvider  metric.MeterProvider
	TracerProvider trace.TracerProvider // default: the global one
}
