package messaging

import (
	"context"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// HeaderCarrier lets the OpenTelemetry propagator read and write the W3C
// trace context (traceparent, tracestate, baggage) in AMQP headers.
type HeaderCarrier amqp.Table

func (c HeaderCarrier) Get(key string) string {
	s, _ := c[key].(string)
	return s
}

func (c HeaderCarrier) Set(key, value string) { c[key] = value }

func (c HeaderCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// Tracer returns the tracer of scope from tp, or from the global provider
// when tp is nil.
func Tracer(tp trace.TracerProvider, scope string) trace.Tracer {
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	if tp == nil {
		tp = noop.NewTracerProvider()
	}
	return tp.Tracer(scope)
}

// Extract returns the trace context carried by a map of string headers
// (an outbox row's) or AMQP headers.
func Extract(ctx context.Context, carrier propagation.TextMapCarrier) context.Context {
	return otel.GetTextMapPropagator().Extract(ctx, carrier)
}
