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
		_, err := r.Pipeline().Record(context.Background(), nacked, func(_ context.Context, m outbox.Marks) (outbox.Marked, error) {
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

// When the broker confirms again after nacking, the rows it nacked are due
// at once: the wait after a nack ends with the broker's trouble, not at a
// time set while it lasted.
func TestNackedRowsAreDueWhenTheBrokerConfirmsAgain(t *testing.T) {
	t.Parallel()
	b := setupRelay(t)
	ids := enqueue(t, b, 3)
	// Two rows nacked a moment ago wait for their next attempt; the third
	// waits for another reason.
	if _, err := b.Pool.Exec(b.Ctx, `UPDATE message_outbox SET next_attempt_at = now() + interval '1 hour',
		last_error = CASE WHEN outbox_id = $1 THEN 'no publisher confirm' ELSE 'nacked by RabbitMQ' END`, ids[2]); err != nil {
		t.Fatal(err)
	}
	r, err := outbox.NewRelay(outbox.Config{ID: "relay-nack", BackoffBase: time.Second},
		messaging.Deps{Pool: b.Pool, Logger: testenv.Logger(), MeterProvider: metricnoop.NewMeterProvider(), TracerProvider: tracenoop.NewTracerProvider()})
	if err != nil {
		t.Fatal(err)
	}
	none := func(context.Context, outbox.Marks) (outbox.Marked, error) { return outbox.Marked{}, nil }
	due := func() (n int) {
		if err := b.Pool.QueryRow(b.Ctx, "SELECT count(*) FROM message_outbox WHERE next_attempt_at <= now()").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for _, result := range []string{"nacked", "connection_lost"} { // still in trouble
		if _, err := r.Pipeline().Record(b.Ctx, []outbox.Outcome{{Row: outbox.Row{Type: "t"}, Result: result}}, none); err != nil {
			t.Fatal(err)
		}
		if n := due(); n != 0 {
			t.Fatalf("after a %s batch, %d rows due; want them waiting", result, n)
		}
	}
	if _, err := r.Pipeline().Record(b.Ctx, []outbox.Outcome{{Row: outbox.Row{Type: "t"}, Result: "nacked"}}, none); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Pipeline().Record(b.Ctx, []outbox.Outcome{{Row: outbox.Row{Type: "t"}, Result: "confirmed"}}, none); err != nil {
		t.Fatal(err)
	}
	if n := due(); n != 2 {
		t.Fatalf("once the broker confirmed again, %d rows due; want the 2 it nacked", n)
	}
}
