package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"

	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/messaging"
	"github.com/yourorg/orders/internal/messaging/outbox/dbsqlc"
)

var queries = dbsqlc.New()

// Writer writes the messages of a process to the outbox: each row is
// published to Exchange with the message type as its routing key.
type Writer struct {
	// Producer names the process: the AMQP app_id of its messages.
	Producer string
	// Exchange is the exchange the rows are published to. Required.
	Exchange string
	// AggregateType names the kind of entity the messages are about (the
	// rows' aggregate_type, such as "order"). Required.
	AggregateType string
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
func (w Writer) Write(ctx context.Context, db database.DBTX, cause messaging.Cause, msgs ...messaging.Message) ([]uuid.UUID, error) {
	b := Buffer{Writer: w}
	ids, err := b.Add(ctx, cause, msgs...)
	if err != nil {
		return nil, err
	}
	return ids, b.Flush(ctx, db)
}

// Buffer holds outbox rows built but not written yet: the messages of
// several changes made in one transaction, written together by Flush in
// one statement (one round trip) instead of one statement per change. The
// consumers' batches use it: each delivery's follow-up messages are added
// as its handler returns them, and the batch flushes them all before its
// commit. Rows that are never flushed are never written: whoever holds a
// Buffer must Flush it in the transaction of the changes, before the
// commit (handlers never see one; the consumer's pipeline flushes).
type Buffer struct {
	Writer
	p dbsqlc.InsertOutboxMessagesParams
}

// Add builds the rows of msgs as Write would, with the cause and the trace
// context of ctx, keeps them for Flush, and returns their ids.
func (b *Buffer) Add(ctx context.Context, cause messaging.Cause, msgs ...messaging.Message) ([]uuid.UUID, error) {
	if len(msgs) == 0 {
		return nil, nil
	}
	if b.Exchange == "" || b.AggregateType == "" {
		return nil, errors.New("outbox writer: Exchange and AggregateType must be set")
	}
	headers := propagation.MapCarrier{}
	otel.GetTextMapPropagator().Inject(ctx, headers)
	if cause.CorrelationID != "" {
		headers[messaging.HeaderCorrelationID] = cause.CorrelationID
	}
	if cause.MessageID != "" {
		headers[messaging.HeaderCausationID] = cause.MessageID
	}
	if b.Producer != "" {
		headers[messaging.HeaderProducer] = b.Producer
	}
	headerJSON, err := json.Marshal(headers)
	if err != nil {
		return nil, fmt.Errorf("encode outbox headers: %w", err)
	}

	// Built aside and appended whole, so that a failed Add leaves nothing.
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
		p.AggregateIds = append(p.AggregateIds, msg.AggregateID())
		p.MessageTypes = append(p.MessageTypes, msg.MessageType())
		p.MessageVersions = append(p.MessageVersions, int32(msg.MessageVersion()))
		p.Payloads = append(p.Payloads, payload)
	}
	q := &b.p
	for range msgs {
		q.AggregateTypes = append(q.AggregateTypes, b.AggregateType)
		q.ExchangeNames = append(q.ExchangeNames, b.Exchange)
		q.Headers = append(q.Headers, headerJSON)
	}
	q.OutboxIds = append(q.OutboxIds, p.OutboxIds...)
	q.AggregateIds = append(q.AggregateIds, p.AggregateIds...)
	q.MessageTypes = append(q.MessageTypes, p.MessageTypes...)
	q.RoutingKeys = append(q.RoutingKeys, p.MessageTypes...) // routed by type
	q.MessageVersions = append(q.MessageVersions, p.MessageVersions...)
	q.Payloads = append(q.Payloads, p.Payloads...)
	return p.OutboxIds, nil
}

// Len is the number of rows waiting for Flush.
func (b *Buffer) Len() int { return len(b.p.OutboxIds) }

// Flush writes the rows added since the last Flush in db (the transaction
// of their changes), in one statement, and empties the buffer.
func (b *Buffer) Flush(ctx context.Context, db database.DBTX) error {
	n := b.Len()
	if n == 0 {
		return nil
	}
	err := queries.InsertOutboxMessages(ctx, db, b.p)
	b.p = dbsqlc.InsertOutboxMessagesParams{}
	if err != nil {
		return fmt.Errorf("insert %d outbox rows: %w", n, database.Translate(err))
	}
	return nil
}
