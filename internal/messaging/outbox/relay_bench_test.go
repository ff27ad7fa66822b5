package outbox_test

import (
	"testing"
	"time"

	"github.com/yourorg/orders/internal/messaging/outbox"
	"github.com/yourorg/orders/internal/messaging/outbox/outboxtest"
)

// The polling relay's benchmarks, measured against the broker's own
// ceiling in the same run (the machines are shared and noisy: compare
// ratios, not absolute numbers). make bench runs them; package wal's
// BenchmarkRelayModes compares the two relays. docs/benchmarks.md has
// figures.

// BenchmarkRelayThroughput drains a backlog of 20,000 rows with the relay,
// then publishes as many messages of the same size with a plain amqp091
// publisher (one channel, confirms pipelined in the same window) to the
// same quorum queue: the ceiling. It reports both rates and their ratio,
// the median of three alternating rounds.
func BenchmarkRelayThroughput(b *testing.B) {
	var relayRates, rawRates []float64
	for range 3 {
		bb := outboxtest.SetupBench(b, outboxtest.Poll)
		raw := bb.RawPublish(b, outboxtest.BenchRows)
		rel := bb.RelayDrain(b, outboxtest.BenchRows)
		rawRates = append(rawRates, raw)
		relayRates = append(relayRates, rel)
	}
	relay, raw := outboxtest.Median(relayRates), outboxtest.Median(rawRates)
	serial := outboxtest.SetupBench(b, outboxtest.Poll).RawSerialPublish(b, 2000)
	dbOnly := claimAndMarkOnly(outboxtest.SetupBench(b, outboxtest.Poll), b, outboxtest.BenchRows)
	b.ReportMetric(relay, "relay-msg/s")
	b.ReportMetric(raw, "raw-msg/s")
	b.ReportMetric(relay/raw, "ratio")
	b.ReportMetric(serial, "one-by-one-msg/s")
	b.ReportMetric(dbOnly, "db-only-rows/s")
	b.Logf("relay %.0f msg/s, raw amqp091 publisher %.0f msg/s, ratio %.2f (rounds: relay %v, raw %v); "+
		"waiting for each confirm in turn: %.0f msg/s; the relay's database work alone (claim + mark, no broker): %.0f rows/s",
		relay, raw, relay/raw, outboxtest.RoundAll(relayRates), outboxtest.RoundAll(rawRates), serial, dbOnly)
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
		bb := outboxtest.SetupBench(b, outboxtest.Poll)
		lat := bb.SteadyLatency(b, mode.notifyOff, 200, 10*time.Second)
		p50, p99 := outboxtest.Percentile(lat, 50), outboxtest.Percentile(lat, 99)
		b.ReportMetric(p50.Seconds()*1000, mode.name+"-p50-ms")
		b.ReportMetric(p99.Seconds()*1000, mode.name+"-p99-ms")
		b.Logf("%s: %d messages at 200/s, commit-to-delivery p50 %s p99 %s", mode.name, len(lat), p50.Round(100*time.Microsecond), p99.Round(100*time.Microsecond))
	}
}

// claimAndMarkOnly is the relay's database work without the broker: claim
// a batch, mark it published, until the backlog is gone. With the raw
// publisher's rate it bounds what the relay can do on one machine, where
// both share the CPUs.
func claimAndMarkOnly(bb *outboxtest.BenchBundle, b *testing.B, n int) float64 {
	b.Helper()
	bb.EnqueueBench(b, n)
	start := time.Now()
	for {
		rows, err := outbox.ClaimRows(bb.Ctx, bb.Pool, "bench", 500, time.Minute)
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
		if _, err := outbox.MarkPublished(bb.Ctx, bb.Pool, claims); err != nil {
			b.Fatal(err)
		}
	}
	return float64(n) / time.Since(start).Seconds()
}
