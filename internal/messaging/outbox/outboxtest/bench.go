package outboxtest

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/yourorg/orders/internal/messaging"
	"github.com/yourorg/orders/internal/messaging/outbox"
)

// What the relays' benchmarks share (package outbox's relay_bench_test.go,
// package wal's bench_test.go): the relay measured against the broker's
// own ceiling in the same run (the machines are shared and noisy: compare
// ratios, not absolute numbers). docs/benchmarks.md has figures.

// BenchRows is the backlog a drain benchmark publishes.
const BenchRows = 20_000

// BenchPayload is a message of a typical size.
func BenchPayload() messaging.Message {
	return Message{
		Type: TypeSubmitted, ID: uuid.New(),
		Lines: []line{{SKU: "SKU-A-1", Quantity: 2, UnitPriceCents: 1250}, {SKU: "SKU-B-2", Quantity: 1, UnitPriceCents: 99}},
	}
}

// BenchBundle is a Bundle with a queue, bench, that takes every message.
type BenchBundle struct {
	*Bundle
}

// SetupBench is Setup for a benchmark of relays of mode.
func SetupBench(b *testing.B, mode Mode) *BenchBundle {
	b.Helper()
	rb := Setup(b, mode)
	rb.BindQueue("bench", "#")
	return &BenchBundle{rb}
}

// RelayDrain enqueues n rows, then times a relay (default settings) from
// start until no row is PENDING or PUBLISHING.
func (bb *BenchBundle) RelayDrain(b *testing.B, n int) float64 {
	b.Helper()
	bb.EnqueueBench(b, n)
	start := time.Now()
	r := bb.StartRelay(outbox.Config{}, bb.AMQPURL, nil)
	for {
		var busy bool
		err := bb.Pool.QueryRow(bb.Ctx, `SELECT EXISTS (SELECT 1 FROM message_outbox WHERE status = 'PENDING')
			OR EXISTS (SELECT 1 FROM message_outbox WHERE status = 'PUBLISHING')`).Scan(&busy)
		if err != nil {
			b.Fatal(err)
		}
		if !busy {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	rate := float64(n) / time.Since(start).Seconds()
	_ = r.Stop()
	bb.Purge(b)
	return rate
}

func (bb *BenchBundle) EnqueueBench(b *testing.B, n int) {
	b.Helper()
	for n > 0 {
		size := min(n, 1000)
		msgs := make([]messaging.Message, size)
		for i := range msgs {
			msgs[i] = BenchPayload()
		}
		if err := pgx.BeginFunc(bb.Ctx, bb.Pool, func(tx pgx.Tx) error {
			_, err := Writer.Write(bb.Ctx, tx, messaging.Cause{CorrelationID: uuid.NewString()}, msgs...)
			return err
		}); err != nil {
			b.Fatal(err)
		}
		n -= size
	}
}

// RawPublish publishes n messages like the relay's (same envelope and
// body size) with nothing but amqp091: one channel, mandatory, persistent,
// confirms pipelined with the relay's default window of 2000.
func (bb *BenchBundle) RawPublish(b *testing.B, n int) float64 {
	b.Helper()
	conn, err := amqp.Dial(bb.AMQPURL)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		b.Fatal(err)
	}
	row := outbox.Row{ID: uuid.New(), Type: TypeSubmitted, Version: 1, Exchange: Exchange,
		RoutingKey: TypeSubmitted, Headers: map[string]string{"correlation_id": uuid.NewString(), "app_id": "bench"}, CreatedAt: time.Now()}
	row.Payload, _ = json.Marshal(BenchPayload())
	const window = 2000
	pending := make(chan *amqp.DeferredConfirmation, window)
	var wg sync.WaitGroup
	wg.Go(func() {
		for dc := range pending {
			if !dc.Wait() {
				b.Error("raw publish nacked")
			}
		}
	})
	start := time.Now()
	for range n {
		row.ID = uuid.New()
		dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), row.Exchange, row.RoutingKey, true, false, outbox.Publishing(row))
		if err != nil {
			b.Fatal(err)
		}
		pending <- dc
	}
	close(pending)
	wg.Wait()
	rate := float64(n) / time.Since(start).Seconds()
	bb.Purge(b)
	return rate
}

// RawSerialPublish is the naive publisher, for contrast: it waits for each
// confirm before the next publish.
func (bb *BenchBundle) RawSerialPublish(b *testing.B, n int) float64 {
	b.Helper()
	conn, err := amqp.Dial(bb.AMQPURL)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		b.Fatal(err)
	}
	row := outbox.Row{Type: TypeSubmitted, Version: 1, Exchange: Exchange, RoutingKey: TypeSubmitted, CreatedAt: time.Now()}
	row.Payload, _ = json.Marshal(BenchPayload())
	start := time.Now()
	for range n {
		row.ID = uuid.New()
		dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), row.Exchange, row.RoutingKey, true, false, outbox.Publishing(row))
		if err != nil {
			b.Fatal(err)
		}
		if !dc.Wait() {
			b.Fatal("nacked")
		}
	}
	rate := float64(n) / time.Since(start).Seconds()
	bb.Purge(b)
	return rate
}

func (bb *BenchBundle) Purge(b *testing.B) {
	b.Helper()
	if _, err := bb.Ch.QueuePurge("bench", false); err != nil {
		b.Fatal(err)
	}
}

// SteadyLatency commits one row every 1/rate seconds for d, and measures
// from each commit to its delivery to a consumer of the queue.
func (bb *BenchBundle) SteadyLatency(b *testing.B, notifyOff bool, rate int, d time.Duration) []time.Duration {
	b.Helper()
	cfg := outbox.Config{NotifyOff: notifyOff}
	r := bb.StartRelay(cfg, bb.AMQPURL, nil)
	defer func() { _ = r.Stop() }()
	for r.Ready(bb.Ctx) != nil {
		time.Sleep(10 * time.Millisecond)
	}

	conn, err := amqp.Dial(bb.AMQPURL)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	deliveries, err := ch.Consume("bench", "", true, false, false, false, nil)
	if err != nil {
		b.Fatal(err)
	}

	var mu sync.Mutex
	committed := map[string]time.Time{}
	var latencies []time.Duration
	total := int(d.Seconds()) * rate
	done := make(chan struct{})
	go func() {
		defer close(done)
		for dlv := range deliveries {
			now := time.Now()
			mu.Lock()
			if at, ok := committed[dlv.MessageId]; ok {
				latencies = append(latencies, now.Sub(at))
			}
			n := len(latencies)
			mu.Unlock()
			if n == total {
				return
			}
		}
	}()

	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	for range total {
		<-tick.C
		var ids []uuid.UUID
		tx, err := bb.Pool.Begin(bb.Ctx)
		if err != nil {
			b.Fatal(err)
		}
		if ids, err = Writer.Write(bb.Ctx, tx, messaging.Cause{}, BenchPayload()); err != nil {
			b.Fatal(err)
		}
		mu.Lock() // before the commit, so the delivery cannot outrun the record
		if err := tx.Commit(bb.Ctx); err != nil {
			mu.Unlock()
			b.Fatal(err)
		}
		committed[ids[0].String()] = time.Now()
		mu.Unlock()
	}
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		b.Fatalf("only %d of %d messages arrived", len(latencies), total)
	}
	return latencies
}

func Percentile(ds []time.Duration, p int) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[min(len(s)-1, len(s)*p/100)]
}

func Median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

func RoundAll(xs []float64) []string {
	out := make([]string, len(xs))
	for i, x := range xs {
		out[i] = fmt.Sprintf("%.0f", x)
	}
	return out
}
