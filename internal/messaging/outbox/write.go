package outbox

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"

	"github.com/yourorg/orders/internal/domain"
	"github.com/yourorg/orders/internal/messaging"
	"github.com/yourorg/orders/internal/messaging/outbox/dbsqlc"
	"github.com/yourorg/orders/internal/store"
)

var queries = dbsqlc.New()

// Writer writes the messages of a process to the outbox. Producer names
// the process (the AMQP app_id of its messages).
type Writer struct {
	Producer string
}

// Write writes msgs to the outbox in the caller's transaction, one row
// each, in one statement, and returns their ids: the AMQP message_id each
// will carry on every publish. The rows commit or roll back with the
// business change beside them; the relay publishes them after commit.
//
// The rows' headers carry the cause (correlation_id, and causation_id when
// a message caused the change) and the trace context of ctx (W3C
// traceparent, tracestate and baggage), so that the relay and the
// consumers continue the trace that wrote the row.
func (w Writer) Write(ctx context.Context, db store.DBTX, cause domain.Cause, msgs ...domain.Message) ([]uuid.UUID, error) {
	if len(msgs) == 0 {
		return nil, nil
	}
	headers := propagation.MapCarrier{}
	otel.GetTextMapPropagator().Inject(ctx, headers)
	if cause.CorrelationID != "" {
		headers[messaging.HeaderCorrelationID] = cause.CorrelationID
	}
	if cause.MessageID != "" {
		headers[messaging.HeaderCausationID] = cause.MessageID
	}
	if w.Producer != "" {
		headers[messaging.HeaderProducer] = w.Producer
	}
	headerJSON, err := json.Marshal(headers)
	if err != nil {
		return nil, fmt.Errorf("encode outbox headers: %w", err)
	}

	var p dbsqlc.InsertOutboxMessagesParams
	for _, msg := range msgs {
		id, err := uuid.NewV7()
		if err != nil {
			return nil, fmt.Errorf("new message id: %w", err)
		}
		// The payload is final here: the relay publishes these bytes as they
		// are, however the code that made them changes later.
		payload, err := json.Marshal(msg)
		if err != nil {
			return nil, fmt.Errorf("encode %s payload: %w", msg.MessageType(), err)
		}
		p.OutboxIds = append(p.OutboxIds, id)
		p.AggregateTypes = append(p.AggregateTypes, domain.AggregateOrder)
		p.AggregateIds = append(p.AggregateIds, msg.OrderID().String())
		p.MessageTypes = append(p.MessageTypes, msg.MessageType())
		p.MessageVersions = append(p.MessageVersions, int32(msg.MessageVersion()))
		p.ExchangeNames = append(p.ExchangeNames, domain.EventsExchange)
		p.RoutingKeys = append(p.RoutingKeys, msg.MessageType())
		p.Payloads = append(p.Payloads, payload)
		p.Headers = append(p.Headers, headerJSON)
	}
	if err := queries.InsertOutboxMessages(ctx, db, p); err != nil {
		return nil, fmt.Errorf("insert outbox rows: %w", store.Translate(err))
	}
	return p.OutboxIds, nil
}
