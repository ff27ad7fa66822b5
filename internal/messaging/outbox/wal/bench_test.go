package wal_test

import (
	"testing"

	"github.com/yourorg/orders/internal/messaging/outbox/outboxtest"
)

// BenchmarkRelayModes drains the same backlog (20,000 rows of the same
// messages, in transactions of 1,000) with the polling relay and with the
// log-tailing relay, each on a fresh database of the same PostgreSQL (the
// tests' own, with wal_level=logical), and publishes as many messages with
// a plain amqp091 publisher: three rates and two ratios, the median of
// three alternating rounds. make bench/relay runs it.
func BenchmarkRelayModes(b *testing.B) {
	// pollOnLogical is the polling relay on the log-tailing relay's server,
	// to compare the two on one server.
	pollOnLogical := outboxtest.Poll
	pollOnLogical.NewDatabase = walMode.NewDatabase
	var pollRates, walRates, rawRates []float64
	for range 3 {
		rawRates = append(rawRates, outboxtest.SetupBench(b, walMode).RawPublish(b, outboxtest.BenchRows))
		pollRates = append(pollRates, outboxtest.SetupBench(b, pollOnLogical).RelayDrain(b, outboxtest.BenchRows))
		walRates = append(walRates, outboxtest.SetupBench(b, walMode).RelayDrain(b, outboxtest.BenchRows))
	}
	poll, wal, raw := outboxtest.Median(pollRates), outboxtest.Median(walRates), outboxtest.Median(rawRates)
	b.ReportMetric(poll/raw, "poll-ratio")
	b.ReportMetric(wal/raw, "wal-ratio")
	b.ReportMetric(raw, "raw-msg/s")
	b.Logf("poll relay %.0f msg/s (ratio %.2f), wal relay %.0f msg/s (ratio %.2f), raw amqp091 publisher %.0f msg/s "+
		"(rounds: poll %v, wal %v, raw %v)", poll, poll/raw, wal, wal/raw, raw,
		outboxtest.RoundAll(pollRates), outboxtest.RoundAll(walRates), outboxtest.RoundAll(rawRates))
}
