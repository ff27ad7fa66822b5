package testenv

import (
	"fmt"
	"os"
	"slices"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.uber.org/goleak"
)

// VerifyNoLeaks runs the tests of a package that starts relays or
// consumers, then fails if any goroutine they started is still running. It
// sets the W3C trace-context propagator first, as each binary does. After
// the tests it stops the binary's PostgreSQL with wal_level=logical, if a
// test started one (LogicalPostgres), before it looks: the server is the
// binary's, not a test's, and its process's goroutine is not a leak. It is
// goleak.VerifyTestMain with that step in the middle: the exit code is the
// tests', or 1 when they passed but left goroutines running. extra are
// further goroutines the package does not count.
func VerifyNoLeaks(m *testing.M, extra ...goleak.Option) {
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	code := m.Run()
	StopLogicalPostgres()
	if code == 0 {
		if err := goleak.Find(append(slices.Clone(leakOptions), extra...)...); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: Errors on successful test run: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// leakOptions are the goroutines VerifyNoLeaks does not count: those of
// libraries, which end in their own time, and this package's own.
var leakOptions = []goleak.Option{
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
	// The thread that starts the processes tied to the test binary (a
	// RabbitCluster's nodes, LogicalPostgres's server) lives as long as
	// the binary, by design.
	goleak.IgnoreAnyFunction("github.com/yourorg/orders/internal/testenv.runStarts"),
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
