package consumer_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/yourorg/orders/migrations"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	metricnoop "go.opentelemetry.io/otel/metric/noop"

	"github.com/yourorg/orders/internal/consumer/fulfillment"
	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/domain"
	"github.com/yourorg/orders/internal/messaging"
	"github.com/yourorg/orders/internal/messaging/inbox"
	"github.com/yourorg/orders/internal/messaging/outbox"
	"github.com/yourorg/orders/internal/store"
	"github.com/yourorg/orders/internal/testenv"
)

// The consumer's benchmarks (docs/benchmarks.md):
//
//	go test -run '^$' -bench . -benchtime 1x ./internal/consumer/

const (
	benchMessages = 4000
	benchWorkers  = 8
)

// BenchmarkFulfillmentThroughput measures the fulfillment consumer on a
// queue of 4,000 order.submitted messages, with 8 workers, batched
// (CONSUMER_BATCH_SIZE 16) and one message per transaction, against a raw
// pgx loop doing the same transaction shape (inbox insert, guarded order
// update, transition insert, outbox insert) one message per transaction
// with 8 goroutines and no broker at all. It reports the rates and the
// ratios to the raw loop, all measured in the same rounds.
func BenchmarkFulfillmentThroughput(b *testing.B) {
	var batchedRates, singleRates, rawRates []float64
	for range 3 { // each measurement on a database and vhost of its own
		f := setupBenchFlow(b)
		rawRates = append(rawRates, f.rawLoop(b, f.createOrders(b, benchMessages)))
		f = setupBenchFlow(b)
		singleRates = append(singleRates, f.consumeQueue(b, f.createOrders(b, benchMessages), 1))
		f = setupBenchFlow(b)
		batchedRates = append(batchedRates, f.consumeQueue(b, f.createOrders(b, benchMessages), 16))
	}
	batched, single, raw := median(batchedRates), median(singleRates), median(rawRates)
	f := setupBenchFlow(b)
	brokerOnly := f.consumeAndAckOnly(b, f.createOrders(b, benchMessages))
	b.ReportMetric(batched, "consumer-batched-msg/s")
	b.ReportMetric(single, "consumer-single-msg/s")
	b.ReportMetric(raw, "raw-tx/s")
	b.ReportMetric(batched/raw, "ratio-batched")
	b.ReportMetric(single/raw, "ratio-single")
	b.ReportMetric(brokerOnly, "broker-only-msg/s")
	b.Logf("fulfillment consumer batched %.0f msg/s (ratio %.2f), one per transaction %.0f msg/s (ratio %.2f), raw pgx loop %.0f tx/s "+
		"(rounds: batched %v, single %v, raw %v); the broker's share alone (deliver and ack, 8 workers, no database): %.0f msg/s",
		batched, batched/raw, single, single/raw, raw, rates(batchedRates), rates(singleRates), rates(rawRates), brokerOnly)
}

// BenchmarkEndToEndLatency posts orders to the API at a steady 40 per
// second for 10 s, with the relay and the three consumers running, and
// reports the time from the order's commit to its FULFILLED transition,
// p50 and p99 (both read from the database clock).
func BenchmarkEndToEndLatency(b *testing.B) {
	f := setup(b, options{relay: true, api: true})
	const rate, seconds = 40, 10
	tick := time.NewTicker(time.Second / rate)
	defer tick.Stop()
	var wg sync.WaitGroup
	for range rate * seconds {
		<-tick.C
		wg.Go(func() {
			req, _ := http.NewRequestWithContext(f.ctx, http.MethodPost, f.api.URL+"/v1/orders",
				strings.NewReader(`{"customer_id":"c","currency":"EUR","items":[{"sku":"A-1","quantity":1,"unit_price_cents":100}]}`))
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil || resp.StatusCode != http.StatusCreated {
				b.Errorf("POST: %v", err)
				return
			}
			resp.Body.Close()
		})
	}
	wg.Wait()
	testenv.WaitFor(b, 60*time.Second, "every order to be FULFILLED", func() bool {
		return f.one("SELECT count(*)::text FROM orders WHERE status <> 'FULFILLED'") == "0"
	})
	var p50, p99 float64
	err := f.pool.QueryRow(f.ctx, `
		SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY ms), percentile_cont(0.99) WITHIN GROUP (ORDER BY ms)
		FROM (SELECT extract(epoch FROM t.created_at - o.created_at) * 1000 AS ms
		      FROM orders o JOIN order_state_transition t ON t.order_id = o.order_id AND t.to_status = 'FULFILLED') x`).Scan(&p50, &p99)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(p50, "commit-to-fulfilled-p50-ms")
	b.ReportMetric(p99, "commit-to-fulfilled-p99-ms")
	b.Logf("%d orders at %d/s: commit to FULFILLED p50 %.1f ms, p99 %.1f ms (three consumer hops, three relay hops)", rate*seconds, rate, p50, p99)
}

type benchFlow struct{ *flow }

func setupBenchFlow(b *testing.B) *benchFlow {
	b.Helper()
	db := testenv.NewDatabase(b, migrations.Schemas...)
	return &benchFlow{&flow{t: b, ctx: b.Context(), pool: db.Pool, dbURL: db.URL, amqpURL: testenv.NewVhost(b)}}
}

// createOrders commits n SUBMITTED orders (not timed).
func (f *benchFlow) createOrders(b *testing.B, n int) []domain.Message {
	b.Helper()
	msgs := make([]domain.Message, 0, n)
	for len(msgs) < n {
		err := pgx.BeginFunc(f.ctx, f.pool, func(tx pgx.Tx) error {
			for range 500 {
				o, _ := domain.NewOrder(uuid.Must(uuid.NewV7()), "customer-1234", "EUR",
					[]domain.Item{{SKU: "SKU-A-1", Quantity: 2, UnitPriceCents: 1250}, {SKU: "SKU-B-2", Quantity: 1, UnitPriceCents: 99}})
				if _, err := store.CreateOrder(f.ctx, tx, o, domain.Cause{}); err != nil {
					return err
				}
				msgs = append(msgs, domain.SubmittedMessage(o))
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	return msgs[:n]
}

// consumeQueue fills the fulfillment queue with msgs, then times the
// fulfillment consumer (8 workers, batches of up to batchSize) from start to
// the last PROCESSED row.
func (f *benchFlow) consumeQueue(b *testing.B, msgs []domain.Message, batchSize int) float64 {
	b.Helper()
	f.fillQueue(b, msgs)
	pool, err := database.NewPool(f.ctx, database.PoolConfig{URL: f.dbURL, MaxConns: benchWorkers + 2})
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	cs, err := inbox.NewConsumers(inbox.Config{Workers: benchWorkers, Prefetch: 256, BatchSize: batchSize},
		messaging.Deps{Pool: pool, AMQPURL: f.amqpURL, Logger: testLogger(), MeterProvider: metricnoop.NewMeterProvider()}, fulfillmentConsumer())
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	start := time.Now()
	go func() { defer close(done); _ = cs.Run(ctx) }()
	for {
		var n int
		if err := f.pool.QueryRow(f.ctx, "SELECT count(*) FROM message_inbox WHERE consumer_name = 'fulfillment' AND status = 'PROCESSED'").Scan(&n); err != nil {
			b.Fatal(err)
		}
		if n >= len(msgs) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	rate := float64(len(msgs)) / time.Since(start).Seconds()
	cancel()
	<-done
	return rate
}

// consumeAndAckOnly is the broker's share of the consumer's work: the same
// queue, deliveries and acks with 8 workers, and nothing else.
func (f *benchFlow) consumeAndAckOnly(b *testing.B, msgs []domain.Message) float64 {
	b.Helper()
	f.fillQueue(b, msgs)
	conn, err := amqp.Dial(f.amqpURL)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	if err := ch.Qos(64, 0, false); err != nil {
		b.Fatal(err)
	}
	deliveries, err := ch.Consume(inbox.QueueName(fulfillment.Name), "", false, false, false, false, nil)
	if err != nil {
		b.Fatal(err)
	}
	var acked sync.WaitGroup
	acked.Add(len(msgs))
	start := time.Now()
	for range benchWorkers {
		go func() {
			for d := range deliveries {
				_ = d.Ack(false)
				acked.Done()
			}
		}()
	}
	acked.Wait()
	return float64(len(msgs)) / time.Since(start).Seconds()
}

// fillQueue declares the fulfillment topology and publishes msgs into it.
func (f *benchFlow) fillQueue(b *testing.B, msgs []domain.Message) {
	b.Helper()
	conn, err := amqp.Dial(f.amqpURL)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	c := fulfillmentConsumer()
	topo := inbox.Topology{Consumer: c.Name(), Exchange: domain.EventsExchange, Types: c.Types(), RetryDelays: []time.Duration{time.Second, 5 * time.Second, 30 * time.Second, 2 * time.Minute}, DeliveryLimit: 20}
	if err := topo.Declare(ch); err != nil {
		b.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		b.Fatal(err)
	}
	var pending []*amqp.DeferredConfirmation
	for _, m := range msgs {
		body, _ := json.Marshal(m)
		row := outbox.Row{ID: uuid.Must(uuid.NewV7()), Type: m.MessageType(), Version: 1, Exchange: domain.EventsExchange,
			RoutingKey: m.MessageType(), Payload: body, Headers: map[string]string{"correlation_id": "bench"}, CreatedAt: time.Now()}
		dc, err := ch.PublishWithDeferredConfirmWithContext(f.ctx, row.Exchange, row.RoutingKey, true, false, outbox.Publishing(row))
		if err != nil {
			b.Fatal(err)
		}
		pending = append(pending, dc)
	}
	for _, dc := range pending {
		dc.Wait()
	}
}

// rawLoop runs the same transaction shape as the fulfillment consumer with
// plain pgx and 8 goroutines, one transaction per message.
func (f *benchFlow) rawLoop(b *testing.B, msgs []domain.Message) float64 {
	b.Helper()
	pool, err := database.NewPool(f.ctx, database.PoolConfig{URL: f.dbURL, MaxConns: benchWorkers + 2})
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	work := make(chan domain.Message)
	var wg sync.WaitGroup
	start := time.Now()
	for range benchWorkers {
		wg.Go(func() {
			for m := range work {
				msgID := uuid.Must(uuid.NewV7()).String()
				body, _ := json.Marshal(m)
				err := pgx.BeginFunc(f.ctx, pool, func(tx pgx.Tx) error {
					if _, err := tx.Exec(f.ctx, `INSERT INTO message_inbox (consumer_name, message_id, message_type, message_version, status, payload_hash)
						VALUES ('raw', $1, 'order.submitted', 1, 'PROCESSED', 'x') ON CONFLICT DO NOTHING`, msgID); err != nil {
						return err
					}
					tag, err := tx.Exec(f.ctx, `UPDATE orders SET status = 'FULFILLMENT_REQUESTED', version = version + 1, updated_at = now()
						WHERE order_id = $1 AND status = 'SUBMITTED'`, m.OrderID())
					if err != nil {
						return err
					}
					if tag.RowsAffected() != 1 {
						return fmt.Errorf("guarded update moved %d rows", tag.RowsAffected())
					}
					if _, err := tx.Exec(f.ctx, `INSERT INTO order_state_transition (order_id, from_status, to_status, message_id, correlation_id)
						VALUES ($1, 'SUBMITTED', 'FULFILLMENT_REQUESTED', $2, 'bench')`, m.OrderID(), msgID); err != nil {
						return err
					}
					_, err = tx.Exec(f.ctx, `INSERT INTO message_outbox (outbox_id, aggregate_type, aggregate_id, message_type, message_version,
						exchange_name, routing_key, payload, headers) VALUES ($1, 'order', $2, 'fulfillment.requested', 1, 'orders.events',
						'fulfillment.requested', $3, '{}')`, uuid.Must(uuid.NewV7()), m.OrderID().String(), body)
					return err
				})
				if err != nil {
					b.Error(err)
				}
			}
		})
	}
	for _, m := range msgs {
		work <- m
	}
	close(work)
	wg.Wait()
	return float64(len(msgs)) / time.Since(start).Seconds()
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

func rates(xs []float64) []string {
	out := make([]string, len(xs))
	for i, x := range xs {
		out[i] = fmt.Sprintf("%.0f", x)
	}
	return out
}

func fulfillmentConsumer() *inbox.Consumer {
	return fulfillment.New(fulfillment.Config{MeterProvider: metricnoop.NewMeterProvider()})
}
