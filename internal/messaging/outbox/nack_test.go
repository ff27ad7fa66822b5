package outbox_test

import (
	"context"
	"testing"
	"time"

	metricnoop "go.opentelemetry.io/otel/metric/noop"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/yourorg/orders/internal/messaging"
	"github.com/yourorg/orders/internal/messaging/outbox"
	"github.com/yourorg/orders/internal/testenv"
)

// The wait after a nack grows with the batches the broker nacked in a
// row, but stays within seconds however many: a node that died under load
// has the survivors nack for a while, and the rows must go out once the
// broker answers again, not minutes later.
func TestNackWaitStaysShort(t *testing.T) {
	t.Parallel()
	cfg := outbox.Config{ID: "relay-nack", BackoffBase: time.Second, BackoffMax: 5 * time.Minute}
	r, err := outbox.NewRelay(cfg, messaging.Deps{Logger: testenv.Logger(), MeterProvider: metricnoop.NewMeterProvider(), TracerProvider: tracenoop.NewTracerProvider()})
	if err != nil {
		t.Fatal(err)
	}
	var longest time.Duration
	for range 50 { // 50 nacked batches in a row
		nacked := []outbox.Outcome{{Row: outbox.Row{Type: "t"}, Result: "nacked", Reason: "nacked by RabbitMQ"}}
		_, err := r.Record(context.Background(), nacked, func(_ context.Context, m outbox.Marks) (outbox.Marked, error) {
			for _, f := range m.Released {
				longest = max(longest, f.RetryIn)
			}
			return outbox.Marked{}, nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if longest > 5*time.Second || longest < time.Second {
		t.Fatalf("the longest wait after 50 nacked batches is %v, want between 1s and 5s", longest)
	}
}
