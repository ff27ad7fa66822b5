package consumer_test

import (
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/yourorg/orders/internal/consumer"
	"github.com/yourorg/orders/internal/domain"
	"github.com/yourorg/orders/internal/testenv"
)

// One order is one trace: the HTTP request, the publish of each of its
// messages, each consumer's processing, and the database queries of all of
// them, parent to child across the outbox rows and the AMQP headers.
func TestOneOrderIsOneTrace(t *testing.T) {
	t.Parallel()
	recorder := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(recorder))
	f := setup(t, options{relay: true, api: true, tracer: tp})

	req, _ := http.NewRequestWithContext(f.ctx, http.MethodPost, f.api.URL+"/v1/orders",
		strings.NewReader(`{"customer_id":"c-1","currency":"EUR","items":[{"sku":"A-1","quantity":1,"unit_price_cents":100}]}`))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != http.StatusCreated {
		t.Fatalf("POST: %v", err)
	}
	resp.Body.Close()

	// The order is done when every consumer that reads one of its four
	// messages (order.submitted, fulfillment.requested,
	// fulfillment.completed and order.fulfilled) has processed it.
	published := []string{domain.TypeOrderSubmitted, domain.TypeFulfillmentRequested, domain.TypeFulfillmentCompleted, domain.TypeOrderFulfilled}
	wantProcess := 0
	for _, c := range consumer.All(consumer.Deps{}) {
		for _, typ := range published {
			if slices.Contains(c.Types(), typ) {
				wantProcess++
			}
		}
	}
	// A publish span ends when the broker's confirm is in, which can be
	// after a consumer has processed the message: wait for both kinds.
	testenv.WaitFor(t, 20*time.Second, "every process and publish span", func() bool {
		process, publish := 0, 0
		for _, s := range recorder.Ended() {
			switch {
			case strings.HasPrefix(s.Name(), "process "):
				process++
			case strings.HasPrefix(s.Name(), "publish orders.events"):
				publish++
			}
		}
		return process >= wantProcess && publish >= len(published)
	})

	spans := recorder.Ended()
	var server sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.Name() == "POST /v1/orders" && s.SpanKind() == trace.SpanKindServer {
			server = s
		}
	}
	if server == nil {
		t.Fatalf("no HTTP server span named \"POST /v1/orders\" among %d spans", len(spans))
	}
	traceID := server.SpanContext().TraceID()
	byID := map[trace.SpanID]sdktrace.ReadOnlySpan{}
	count := map[string]int{}
	for _, s := range spans {
		if s.SpanContext().TraceID() != traceID {
			continue
		}
		byID[s.SpanContext().SpanID()] = s
		switch {
		case strings.HasPrefix(s.Name(), "publish orders.events"):
			count["publish"]++
		case strings.HasPrefix(s.Name(), "process "):
			count["process"]++
		case attr(s, "db.system.name") == "postgresql" || attr(s, "db.system") == "postgresql":
			count["db"]++
		}
	}
	// The four messages are published, each is processed by every
	// consumer that reads it (fulfillment: order.submitted and
	// fulfillment.completed; the warehouse: fulfillment.requested;
	// notification: order.submitted and order.fulfilled; shipping:
	// order.fulfilled), and every hop touched the database.
	if count["publish"] != len(published) || count["process"] != wantProcess || count["db"] < 10 {
		t.Fatalf("spans in the order's trace: %v", count)
	}

	for _, s := range byID {
		parent, hasParent := byID[s.Parent().SpanID()]
		switch {
		case strings.HasPrefix(s.Name(), "publish orders.events"):
			// A publish continues the span that wrote the outbox row: the
			// request, or the processing of the message that caused it.
			if !hasParent || (parent != server && !strings.HasPrefix(parent.Name(), "process ")) {
				t.Errorf("publish of %s: parent %v", attr(s, "messaging.message.id"), name(parent))
			}
			for _, key := range []string{"messaging.system", "messaging.destination.name", "messaging.operation.type",
				"messaging.message.id", "messaging.message.body.size", "messaging.rabbitmq.destination.routing_key"} {
				if attr(s, key) == "" {
					t.Errorf("publish span lacks %s", key)
				}
			}
			if s.SpanKind() != trace.SpanKindProducer || attr(s, "messaging.system") != "rabbitmq" {
				t.Errorf("publish span kind %v, system %s", s.SpanKind(), attr(s, "messaging.system"))
			}
		case strings.HasPrefix(s.Name(), "process "):
			// A process span is the child of the publish of its message.
			if !hasParent || !strings.HasPrefix(parent.Name(), "publish orders.events") ||
				attr(parent, "messaging.message.id") != attr(s, "messaging.message.id") {
				t.Errorf("%s of %s: parent %v", s.Name(), attr(s, "messaging.message.id"), name(parent))
			}
			if s.SpanKind() != trace.SpanKindConsumer || attr(s, "messaging.operation.type") != "process" || attr(s, "messaging.consumer.group.name") == "" {
				t.Errorf("%s: kind %v, attributes %v", s.Name(), s.SpanKind(), s.Attributes())
			}
		}
	}

	// Each batch publish links the traces of the rows it carried.
	linked := false
	for _, s := range spans {
		if s.Name() == "publish batch" {
			for _, l := range s.Links() {
				linked = linked || l.SpanContext.TraceID() == traceID
			}
		}
	}
	if !linked {
		t.Error("no batch publish span links the order's trace")
	}
	// Every inbox row names the trace.
	if n := f.one("SELECT count(*)::text FROM message_inbox WHERE trace_id IS DISTINCT FROM $1", traceID.String()); n != "0" {
		t.Errorf("%s inbox rows without the order's trace id", n)
	}
}

func attr(s sdktrace.ReadOnlySpan, key string) string {
	if s == nil {
		return ""
	}
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return kv.Value.String()
		}
	}
	return ""
}

func name(s sdktrace.ReadOnlySpan) string {
	if s == nil {
		return "<none in the trace>"
	}
	return s.Name()
}
