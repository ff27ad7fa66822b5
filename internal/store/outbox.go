package store

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"

	"github.com/yourorg/orders/internal/domain"
	"github.com/yourorg/orders/internal/store/dbsqlc"
)

// Outbox header names. The relay copies them into the AMQP message.
const (
	HeaderCorrelationID = "correlation_id"
	HeaderCausationID   = "causation_id"
	// HeaderProducer names the process that wrote the row; the relay sends
	// it as the AMQP app_id.
	HeaderProducer = "app_id"
)

// MessageMeta is the envelope metadata the messages of one transaction share.
type MessageMeta struct {
	// CorrelationID ties every message of a flow to the request that began it.
	CorrelationID string
	// CausationID is the message_id of the message being handled, if any.
	CausationID string
	// Producer is the process writing the messages (the AMQP app_id).
	Producer string
}

// EnqueueMessages writes msgs to the outbox in the caller's transaction, one
// row each, in one statement, and returns their ids: the AMQP message_id
// each will carry on every publish. The rows commit or roll back with the
// business change beside them; the relay publishes them after commit.
//
// The headers carry meta and the trace context of ctx (W3C traceparent,
// tracestate and baggage), so that the relay and the consumers continue the
// trace that wrote the row.
func EnqueueMessages(ctx context.Context, db DBTX, meta MessageMeta, msgs ...domain.Message) ([]uuid.UUID, error) {
	headers := propagation.MapCarrier{}
	otel.GetTextMapPropagator().Inject(ctx, headers)
	if meta.CorrelationID != "" {
		headers[HeaderCorrelationID] = meta.CorrelationID
	}
	if meta.CausationID != "" {
		headers[HeaderCausationID] = meta.CausationID
	}
	if meta.Producer != "" {
		headers[HeaderProducer] = meta.Producer
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
	if len(p.OutboxIds) == 0 {
		return nil, nil
	}
	if err := queries.InsertOutboxMessages(ctx, db, p); err != nil {
		return nil, fmt.Errorf("insert outbox rows: %w", translate(err))
	}
	return p.OutboxIds, nil
}
