package messaging

import (
	"context"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// tracerName is the instrumentation scope of the spans of this package.
const tracerName = "github.com/yourorg/orders/internal/messaging"

// headerCarrier lets the OpenTelemetry propagator read and write the W3C
// trace context (traceparent, tracestate, baggage) in AMQP headers.
type headerCarrier amqp.Table

func (c headerCarrier) Get(key string) string {
	s, _ := c[key].(string)
	return s
}

func (c headerCarrier) Set(key, value string) { c[key] = value }

func (c headerCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// tracerOf returns the tracer of tp, or of the global provider.
func tracerOf(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	if tp == nil {
		tp = noop.NewTracerProvider()
	}
	return tp.Tracer(tracerName)
}

// extract returns the trace context carried by a map of string headers
// (an outbox row's) or AMQP headers.
func extract(ctx context.Context, carrier propagation.TextMapCarrier) context.Context {
	return otel.GetTextMapPropagator().Extract(ctx, carrier)
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
	otel.GetTextMapPropagator().Inject(ctx, headerCarrier(msg.Headers))
	return span
}

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
	parent := extract(ctx, headerCarrier(raw.Headers))
	if _, replayed := raw.Headers[HeaderReplayedAt]; replayed {
		if remote := trace.SpanContextFromContext(parent); remote.IsValid() {
			opts = append(opts, trace.WithNewRoot(), trace.WithLinks(trace.Link{SpanContext: remote}))
		}
	}
	return tracer.Start(parent, "process "+queue, opts...)
}
