package httpapi_test

import (
	"encoding/json"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/yourorg/orders/internal/httpapi"
)

// What a client sends of a trace shapes nothing: its traceparent is linked
// from a trace of the API's own, not continued, and its baggage is not
// read, so none of it reaches the outbox row (nor, through it, any message
// that follows). The row carries the API's own span.
func TestCallersTraceIsLinkedNotContinued(t *testing.T) {
	t.Parallel()
	recorder := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(recorder))
	t.Cleanup(func() { _ = tp.Shutdown(t.Context()) })
	b := setupWith(t, func(_ *httpapi.Config, d *httpapi.Deps) { d.TracerProvider = tp })

	const callerTrace, callerSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	o := b.createOrder(validOrder, header{
		"traceparent": "00-" + callerTrace + "-" + callerSpan + "-01",
		"baggage":     "secret.session=s3cr3t," + "filler=" + strings.Repeat("x", 4000),
	})

	var raw []byte
	if err := b.pool.QueryRow(t.Context(), "SELECT headers FROM message_outbox WHERE aggregate_id = $1", o.OrderID).Scan(&raw); err != nil {
		t.Fatal(err)
	}
	var headers map[string]string
	if err := json.Unmarshal(raw, &headers); err != nil {
		t.Fatal(err)
	}
	if bag, ok := headers["baggage"]; ok || strings.Contains(string(raw), "s3cr3t") {
		t.Errorf("the caller's baggage reached the outbox row: %q", bag)
	}

	var server sdktrace.ReadOnlySpan
	for _, s := range recorder.Ended() {
		if s.Name() == "POST /v1/orders" {
			server = s
		}
	}
	if server == nil {
		t.Fatal("no server span POST /v1/orders")
	}
	sc := server.SpanContext()
	switch {
	case sc.TraceID().String() == callerTrace || server.Parent().IsValid():
		t.Errorf("the server span continues the caller's trace (trace %s, parent %v), want a trace of its own", sc.TraceID(), server.Parent())
	case len(server.Links()) != 1 || server.Links()[0].SpanContext.TraceID().String() != callerTrace ||
		server.Links()[0].SpanContext.SpanID().String() != callerSpan:
		t.Errorf("the server span's links %+v, want one to the caller's span %s/%s", server.Links(), callerTrace, callerSpan)
	}
	if tp := headers["traceparent"]; !strings.Contains(tp, sc.TraceID().String()) {
		t.Errorf("the outbox row's traceparent %q is not the server span's trace %s", tp, sc.TraceID())
	}
}
