package testenv

import (
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.uber.org/goleak"
)

// VerifyNoLeaks runs the tests of a package that starts relays or
// consumers, then fails if any goroutine they started is still running. It
// sets the W3C trace-context propagator first, as each binary does.
func VerifyNoLeaks(m *testing.M) {
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	goleak.VerifyTestMain(m,
		// pgx's background pool health check and toxiproxy's accept loops
		// end shortly after their owners close; these are not ours.
		goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"),
		goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2.(*Proxy).server"),
		goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2/stream.(*ChanReader).Read"),
		goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2/toxics.(*ToxicStub).Run"),
		goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2.(*ToxicLink).Start.func1"),
		// A link's reader that was mid-write when its proxy stopped (a cut,
		// or the end of a test that stalled it) waits forever on
		// toxiproxy's internal channel: the test proxy's, not ours.
		goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2.(*ToxicLink).read"),
	)
}

// NewChannel opens an AMQP connection and a channel on amqpURL for t, both
// closed when t ends.
func NewChannel(t testing.TB, amqpURL string) *amqp.Channel {
	t.Helper()
	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	return ch
}
