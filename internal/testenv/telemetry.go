package testenv

import (
	"context"
	"io"
	"log/slog"
	"os"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// Logger discards logs, or writes them to stderr when TEST_LOG is set.
func Logger() *slog.Logger {
	if os.Getenv("TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// Metrics is a meter provider whose instruments a test reads back.
type Metrics struct {
	Provider *sdkmetric.MeterProvider
	reader   *sdkmetric.ManualReader
}

// NewMetrics returns a meter provider for the components under test.
func NewMetrics() *Metrics {
	reader := sdkmetric.NewManualReader()
	return &Metrics{Provider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)), reader: reader}
}

// Counter is the sum of every data point of the int64 counter name.
func (m *Metrics) Counter(t testing.TB, name string) int64 {
	t.Helper()
	return m.CounterWith(t, name, "", "")
}

// CounterWith is the sum of the data points of the int64 counter name
// whose attribute key has value (every point when key is "").
func (m *Metrics) CounterWith(t testing.TB, name, key, value string) int64 {
	t.Helper()
	return m.sum(t, name, func(data metricdata.Aggregation) []metricdata.DataPoint[int64] {
		if sum, ok := data.(metricdata.Sum[int64]); ok {
			return sum.DataPoints
		}
		return nil
	}, key, value)
}

// Gauge is the sum of every data point of the int64 gauge name.
func (m *Metrics) Gauge(t testing.TB, name string) int64 {
	t.Helper()
	return m.sum(t, name, func(data metricdata.Aggregation) []metricdata.DataPoint[int64] {
		if g, ok := data.(metricdata.Gauge[int64]); ok {
			return g.DataPoints
		}
		return nil
	}, "", "")
}

// sum adds up the points that points finds in instrument name, those whose
// attribute key has value (every point when key is "").
func (m *Metrics) sum(t testing.TB, name string, points func(metricdata.Aggregation) []metricdata.DataPoint[int64], key, value string) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := m.reader.Collect(context.Background(), &rm); err != nil {
		// An observable gauge whose callback failed (it reads the database,
		// and a test may have cut it off): the counters are still there.
		t.Logf("testenv: collecting metrics: %v", err)
	}
	var total int64
	for _, sm := range rm.ScopeMetrics {
		for _, metric := range sm.Metrics {
			if metric.Name != name {
				continue
			}
			for _, dp := range points(metric.Data) {
				if v, ok := dp.Attributes.Value(attribute.Key(key)); key == "" || ok && v.AsString() == value {
					total += dp.Value
				}
			}
		}
	}
	return total
}
