package pipeline

import (
	"context"

	amqp "github.com/rabbitmq/amqp091-go"

	"go.opentelemetry.io/otel"
	semconv "go.opentelemetry.io/otel/semconv/v1.32.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/yourorg/orders/internal/messaging"
)

// HeaderPartition is the AMQP header that carries a message's partition
// (outbox.Config.Partitions).
const HeaderPartition = "partition"

// Publishing builds the AMQP message of an outbox row: its envelope
// (docs/messaging.md). The message_id is the row's id on every attempt, so
// consumers can deduplicate; the timestamp is when the row was written; the
// headers of the row (trace context, correlation and causation ids) travel
// as AMQP headers, except the producer, which becomes the app_id.
func Publishing(row Row) amqp.Publishing {
	headers := amqp.Table{messaging.HeaderMessageVersion: int32(row.Version)}
	if row.Partition >= 0 {
		headers[HeaderPartition] = int32(row.Partition)
	}
	for k, v := range row.Headers {
		if k != messaging.HeaderProducer {
			headers[k] = v
		}
	}
	return amqp.Publishing{
		MessageId:     row.ID.String(),
		Type:          row.Type,
		ContentType:   messaging.ContentTypeJSON,
		DeliveryMode:  amqp.Persistent,
		Timestamp:     row.CreatedAt,
		CorrelationId: row.Headers[messaging.HeaderCorrelationID],
		AppId:         row.Headers[messaging.HeaderProducer],
		Headers:       headers,
		Body:          row.Payload,
	}
}

// publishSpan starts the span of one publish: a child of the context that
// wrote the outbox row, so the message joins the trace of its cause.
func publishSpan(tracer trace.Tracer, parent context.Context, msg *amqp.Publishing, exchange, routingKey string) trace.Span {
	ctx, span := tracer.Start(parent, "publish "+exchange,
		trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(
			semconv.MessagingSystemRabbitMQ,
			semconv.MessagingOperationTypeSend,
			semconv.MessagingOperationName("publish"),
			semconv.MessagingDestinationName(exchange),
			semconv.MessagingRabbitMQDestinationRoutingKey(routingKey),
			semconv.MessagingMessageID(msg.MessageId),
			semconv.MessagingMessageConversationID(msg.CorrelationId),
			semconv.MessagingMessageBodySize(len(msg.Body)),
		))
	// The consumer continues from this span, not from the row's writer.
	otel.GetTextMapPropagator().Inject(ctx, messaging.HeaderCarrier(msg.Headers))
	return span
}
