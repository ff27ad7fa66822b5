package messaging

import (
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// SecondsBuckets are the histogram buckets of the outbox's and the inbox's
// durations: 1 ms to 10 s.
var SecondsBuckets = metric.WithExplicitBucketBoundaries(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)

// Counters makes the message counters of one meter, keeping the first
// error, so that a list of them reads as a list:
//
//	mc := messaging.Counters{Meter: meter}
//	m.published = mc.Counter("outbox.messages.published", "...")
//	m.failed = mc.Counter("outbox.messages.failed", "...")
//	if mc.Err != nil { ... }
type Counters struct {
	Meter metric.Meter
	Err   error
}

// Counter makes one counter of messages, unless an earlier one failed.
func (mc *Counters) Counter(name, desc string) metric.Int64Counter {
	if mc.Err != nil {
		return nil
	}
	c, err := mc.Meter.Int64Counter(name, metric.WithDescription(desc), metric.WithUnit("{message}"))
	mc.Err = err
	return c
}

// Attribute keys the outbox's and the inbox's metrics share.
var (
	AttrMessageType = attribute.Key("message_type")
	AttrOutcome     = attribute.Key("outcome")
)
