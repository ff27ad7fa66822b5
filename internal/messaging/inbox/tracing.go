package inbox

import (
	"context"

	amqp "github.com/rabbitmq/amqp091-go"
	semconv "go.opentelemetry.io/otel/semconv/v1.32.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/yourorg/orders/internal/messaging"
	"github.com/yourorg/orders/internal/messaging/inbox/internal/resend"
)

// processSpan starts the span of processing one delivery: a child of the
// publish span whose context the message carries. A message replayed from
// the parking lot starts a trace of its own, linked to the one it came from.
func processSpan(ctx context.Context, tracer trace.Tracer, raw amqp.Delivery, queue, consumer string) (context.Context, trace.Span) {
	opts := []trace.SpanStartOption{
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(
			semconv.MessagingSystemRabbitMQ,
			semconv.MessagingOperationTypeProcess,
			semconv.MessagingOperationName("process"),
			semconv.MessagingDestinationName(queue),
			semconv.MessagingConsumerGroupName(consumer),
			semconv.MessagingRabbitMQDestinationRoutingKey(raw.RoutingKey),
			semconv.MessagingRabbitMQMessageDeliveryTag(int(raw.DeliveryTag)),
			semconv.MessagingMessageID(raw.MessageId),
			semconv.MessagingMessageConversationID(raw.CorrelationId),
			semconv.MessagingMessageBodySize(len(raw.Body)),
		),
	}
	parent := messaging.Extract(ctx, messaging.HeaderCarrier(raw.Headers))
	if _, replayed := raw.Headers[resend.HeaderReplayedAt]; replayed {
		if remote := trace.SpanContextFromContext(parent); remote.IsValid() {
			opts = append(opts, trace.WithNewRoot(), trace.WithLinks(trace.Link{SpanContext: remote}))
		}
	}
	return tracer.Start(parent, "process "+queue, opts...)
}
