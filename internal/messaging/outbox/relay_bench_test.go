package outbox_test

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
	"github.com/yourorg/orders/internal/testenv"
)

// The relay's benchmark, measured against the broker's own ceiling in the
// same run (the machines are shared and noisy: compare ratios, not
// absolute numbers). Run with `make bench`; docs/benchmarks.md has figures.
//
//	go test -run '^$' -bench Relay -benchtime 1x ./internal/messaging/

const benchRows = 20_000

func benchPayload() messaging.Message {
	return testMessage{
		Type: typeSubmitted, ID: uuid.New(),
		Lines: []line{{SKU: "SKU-A-1", Quantity: 2, UnitPriceCents: 1250}, {SKU: "SKU-B-2", Quantity: 1, UnitPriceCents: 99}},
	}
}

// BenchmarkRelayThroughput drains a backlog of 20,000 rows with the relay,
// then publishes as many messages of the same size with a plain amqp091
// publisher (one channel, confirms pipelined in the same window) to the
// same quorum queue: the ceiling. It reports both rates and their ratio,
// the median of three alternating rounds.
func BenchmarkRelayThroughput(b *testing.B) {
	var relayRates, rawRates []float64
	for range 3 {
		bb := setupBench(b)
		raw := bb.rawPublish(b, benchRows)
		rel := bb.relayDrain(b, benchRows)
		rawRates = append(rawRates, raw)
		relayRates = append(relayRates, rel)
	}
	relay, raw := median(relayRates), median(rawRates)
	serial := setupBench(b).rawSerialPublish(b, 2000)
	dbOnly := setupBench(b).claimAndMarkOnly(b, benchRows)
	b.ReportMetric(relay, "relay-msg/s")
	b.ReportMetric(raw, "raw-msg/s")
	b.ReportMetric(relay/raw, "ratio")
	b.ReportMetric(serial, "one-by-one-msg/s")
	b.ReportMetric(dbOnly, "db-only-rows/s")
	b.Logf("relay %.0f msg/s, raw amqp091 publisher %.0f msg/s, ratio %.2f (rounds: relay %v, raw %v); "+
		"waiting for each confirm in turn: %.0f msg/s; the relay's database work alone (claim + mark, no broker): %.0f rows/s",
		relay, raw, relay/raw, roundAll(relayRates), roundAll(rawRates), serial, dbOnly)
}

// BenchmarkRelayModes drains the same backlog (20,000 rows of the same
// messages, in transactions of 1,000) with the polling relay and with the
// log-tailing relay, each on a fresh database of the same PostgreSQL (the
// tests' own, with wal_level=logical), and publishes as many messages with
// a plain amqp091 publisher: three rates and two ratios, the median of
// three alternating rounds. make bench/relay runs it.
func BenchmarkRelayModes(b *testing.B) {
	var pollRates, walRates, rawRates []float64
	for range 3 {
		rawRates = append(rawRates, setupBenchIn(b, "wal").rawPublish(b, benchRows))
		pollRates = append(pollRates, setupBenchIn(b, "poll-on-logical").relayDrain(b, benchRows))
		walRates = append(walRates, setupBenchIn(b, "wal").relayDrain(b, benchRows))
	}
	poll, wal, raw := median(pollRates), median(walRates), median(rawRates)
	b.ReportMetric(poll/raw, "poll-ratio")
	b.ReportMetric(wal/raw, "wal-ratio")
	b.ReportMetric(raw, "raw-msg/s")
	b.Logf("poll relay %.0f msg/s (ratio %.2f), wal relay %.0f msg/s (ratio %.2f), raw amqp091 publisher %.0f msg/s "+
		"(rounds: poll %v, wal %v, raw %v)", poll, poll/raw, wal, wal/raw, raw, roundAll(pollRates), roundAll(walRates), roundAll(rawRates))
}

// BenchmarkRelayLatency commits one row at a time at a steady 200 rows/s
// for 10 s and reports commit-to-delivery latency (the client's commit
// returned -> a consumer on the queue has the message), p50 and p99, with
// LISTEN/NOTIFY and with polling only (the default 1 s interval).
func BenchmarkRelayLatency(b *testing.B) {
	for _, mode := range []struct {
		name      string
		notifyOff bool
	}{{"notify", false}, {"poll", true}} {
		bb := setupBench(b)
		lat := bb.steadyLatency(b, mode.notifyOff, 200, 10*time.Second)
		p50, p99 := percentile(lat, 50), percentile(lat, 99)
		b.ReportMetric(p50.Seconds()*1000, mode.name+"-p50-ms")
		b.ReportMetric(p99.Seconds()*1000, mode.name+"-p99-ms")
		b.Logf("%s: %d messages at 200/s, commit-to-delivery p50 %s p99 %s", mode.name, len(lat), p50.Round(100*time.Microsecond), p99.Round(100*time.Microsecond))
	}
}

type benchBundle struct {
	*relayBundle
}

func setupBench(b *testing.B) *benchBundle {
	b.Helper()
	return setupBenchIn(b, relayMode)
}

// setupBenchIn is setupBench for relays of mode; poll-on-logical is the
// polling relay on the PostgreSQL of the wal relay, to compare the two on
// one server.
func setupBenchIn(b *testing.B, mode string) *benchBundle {
	b.Helper()
	var rb *relayBundle
	if mode == "poll-on-logical" {
		db := testenv.LogicalPostgres(b).NewDatabase(b, outbox.Schema)
		rb = &relayBundle{t: b, mode: "poll", ctx: b.Context(), pool: db.Pool, dbURL: db.URL, amqpURL: testenv.NewVhost(b)}
		rb.ch = testenv.NewChannel(b, rb.amqpURL)
		if err := messaging.DeclareExchange(rb.ch, testExchange); err != nil {
			b.Fatal(err)
		}
		rb.metrics = testenv.NewMetrics()
	} else {
		rb = setupRelayIn(b, mode)
	}
	rb.bindQueue("bench", "#")
	return &benchBundle{rb}
}

// relayDrain enqueues n rows, then times a relay (default settings) from
// start until no row is PENDING or PUBLISHING.
func (bb *benchBundle) relayDrain(b *testing.B, n int) float64 {
	b.Helper()
	bb.enqueueBench(b, n)
	start := time.Now()
	r := bb.startRelay(outbox.Config{}, bb.amqpURL, nil)
	for {
		var busy bool
		err := bb.pool.QueryRow(bb.ctx, `SELECT EXISTS (SELECT 1 FROM message_outbox WHERE status = 'PENDING')
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
	_ = r.stop()
	bb.purge(b)
	return rate
}

func (bb *benchBundle) enqueueBench(b *testing.B, n int) {
	b.Helper()
	for n > 0 {
		size := min(n, 1000)
		msgs := make([]messaging.Message, size)
		for i := range msgs {
			msgs[i] = benchPayload()
		}
		if err := pgx.BeginFunc(bb.ctx, bb.pool, func(tx pgx.Tx) error {
			_, err := writer.Write(bb.ctx, tx, messaging.Cause{CorrelationID: uuid.NewString()}, msgs...)
			return err
		}); err != nil {
			b.Fatal(err)
		}
		n -= size
	}
}

// rawPublish publishes n messages like the relay's (same envelope and
// body size) with nothing but amqp091: one channel, mandatory, persistent,
// confirms pipelined with the relay's default window of 2000.
func (bb *benchBundle) rawPublish(b *testing.B, n int) float64 {
	b.Helper()
	conn, err := amqp.Dial(bb.amqpURL)
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
	row := outbox.Row{ID: uuid.New(), Type: typeSubmitted, Version: 1, Exchange: testExchange,
		RoutingKey: typeSubmitted, Headers: map[string]string{"correlation_id": uuid.NewString(), "app_id": "bench"}, CreatedAt: time.Now()}
	row.Payload, _ = json.Marshal(benchPayload())
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
	bb.purge(b)
	return rate
}

// claimAndMarkOnly is the relay's database work without the broker: claim
// a batch, mark it published, until the backlog is gone. With the raw
// publisher's rate it bounds what the relay can do on one machine, where
// both share the CPUs.
func (bb *benchBundle) claimAndMarkOnly(b *testing.B, n int) float64 {
	b.Helper()
	bb.enqueueBench(b, n)
	start := time.Now()
	for {
		rows, err := outbox.ClaimRows(bb.ctx, bb.pool, "bench", 500, time.Minute)
		if err != nil {
			b.Fatal(err)
		}
		if len(rows) == 0 {
			break
		}
		claims := make([]outbox.Claim, len(rows))
		for i, r := range rows {
			claims[i] = r.Claim()
		}
		if _, err := outbox.MarkPublished(bb.ctx, bb.pool, claims); err != nil {
			b.Fatal(err)
		}
	}
	return float64(n) / time.Since(start).Seconds()
}

// rawSerialPublish is the naive publisher, for contrast: it waits for each
// confirm before the next publish.
func (bb *benchBundle) rawSerialPublish(b *testing.B, n int) float64 {
	b.Helper()
	conn, err := amqp.Dial(bb.amqpURL)
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
	row := outbox.Row{Type: typeSubmitted, Version: 1, Exchange: testExchange, RoutingKey: typeSubmitted, CreatedAt: time.Now()}
	row.Payload, _ = json.Marshal(benchPayload())
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
	bb.purge(b)
	return rate
}

func (bb *benchBundle) purge(b *testing.B) {
	b.Helper()
	if _, err := bb.ch.QueuePurge("bench", false); err != nil {
		b.Fatal(err)
	}
}

// steadyLatency commits one row every 1/rate seconds for d, and measures
// from each commit to its delivery to a consumer of the queue.
func (bb *benchBundle) steadyLatency(b *testing.B, notifyOff bool, rate int, d time.Duration) []time.Duration {
	b.Helper()
	cfg := outbox.Config{NotifyOff: notifyOff}
	r := bb.startRelay(cfg, bb.amqpURL, nil)
	defer func() { _ = r.stop() }()
	for r.Ready(bb.ctx) != nil {
		time.Sleep(10 * time.Millisecond)
	}

	conn, err := amqp.Dial(bb.amqpURL)
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
		tx, err := bb.pool.Begin(bb.ctx)
		if err != nil {
			b.Fatal(err)
		}
		if ids, err = writer.Write(bb.ctx, tx, messaging.Cause{}, benchPayload()); err != nil {
			b.Fatal(err)
		}
		mu.Lock() // before the commit, so the delivery cannot outrun the record
		if err := tx.Commit(bb.ctx); err != nil {
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

func percentile(ds []time.Duration, p int) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[min(len(s)-1, len(s)*p/100)]
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

func roundAll(xs []float64) []string {
	out := make([]string, len(xs))
	for i, x := range xs {
		out[i] = fmt.Sprintf("%.0f", x)
	}
	return out
}
