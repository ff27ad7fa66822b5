package messaging

import "go.opentelemetry.io/otel/metric"

// secondsBuckets are the histogram buckets of the relay's and the
// consumers' durations: 1 ms to 10 s.
var secondsBuckets = metric.WithExplicitBucketBoundaries(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)

// messageCounters makes the counters of messages of one meter, keeping the
// first error, so that a list of them reads as a list.
type messageCounters struct {
	meter metric.Meter
	err   error
}

func (mc *messageCounters) counter(name, desc string) metric.Int64Counter {
	if mc.err != nil {
		return nil
	}
	c, err := mc.meter.Int64Counter(name, metric.WithDescription(desc), metric.WithUnit("{message}"))
	mc.err = err
	return c
}
