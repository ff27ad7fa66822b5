package outbox

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/yourorg/orders/internal/messaging"
	"github.com/yourorg/orders/internal/messaging/tablestats"
)

// relayMetrics are the relay's instruments beside the pipeline's
// (docs/observability.md lists them with the alerts to set).
type relayMetrics struct {
	recovered metric.Int64Counter
	batchSize metric.Int64Histogram
}

func newRelayMetrics(meter metric.Meter, r *Relay) (*relayMetrics, error) {
	var (
		m   relayMetrics
		err error
	)
	mc := &messaging.Counters{Meter: meter}
	counter := mc.Counter
	m.recovered = counter("outbox.lease.recovered", "PUBLISHING rows taken back after their relay's lease expired.")
	if mc.Err != nil {
		return nil, mc.Err
	}
	m.recovered.Add(context.Background(), 0)
	if m.batchSize, err = meter.Int64Histogram("outbox.claim.batch_size", metric.WithUnit("{message}"),
		metric.WithExplicitBucketBoundaries(1, 10, 50, 100, 250, 500, 1000),
		metric.WithDescription("Rows per claim.")); err != nil {
		return nil, err
	}

	// The backlog is read from the table at scrape time, so it is right
	// whichever relay is scraped (the same for all of them).
	pending, err := meter.Int64ObservableGauge("outbox.pending", metric.WithUnit("{message}"),
		metric.WithDescription("Outbox rows waiting to be published (PENDING), by message type."))
	if err != nil {
		return nil, err
	}
	oldest, err := meter.Float64ObservableGauge("outbox.pending.oldest_age", metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest PENDING outbox row."))
	if err != nil {
		return nil, err
	}
	publishing, err := meter.Int64ObservableGauge("outbox.publishing", metric.WithUnit("{message}"),
		metric.WithDescription("Outbox rows claimed by a relay and not yet marked (PUBLISHING)."))
	if err != nil {
		return nil, err
	}
	failedRows, err := meter.Int64ObservableGauge("outbox.failed.rows", metric.WithUnit("{message}"),
		metric.WithDescription("Outbox rows in FAILED, waiting for an operator, by message type."))
	if err != nil {
		return nil, err
	}
	inFlight, err := meter.Int64ObservableGauge("relay.in_flight", metric.WithUnit("{message}"),
		metric.WithDescription("Messages this relay published and has not yet seen confirmed."))
	if err != nil {
		return nil, err
	}
	missingReaders, err := meter.Int64ObservableGauge("relay.readers.missing", metric.WithUnit("{queue}"),
		metric.WithDescription("Reader queues missing (RELAY readers of a message type): the relay holds the messages of their types back, by message type."))
	if err != nil {
		return nil, err
	}
	connected, err := meter.Int64ObservableGauge("relay.broker.connected",
		metric.WithDescription("1 while this relay holds an open confirm channel to RabbitMQ."))
	if err != nil {
		return nil, err
	}
	horizon, err := meter.Float64ObservableGauge("outbox.time_partitions.horizon", metric.WithUnit("s"),
		metric.WithDescription("Time until the last time partition of message_outbox ends: a message written after it is refused."))
	if err != nil {
		return nil, err
	}
	held, err := meter.Int64ObservableGauge("outbox.time_partitions.held", metric.WithUnit("{partition}"),
		metric.WithDescription("Time partitions past retention that retention cannot drop yet: rows of theirs are not PUBLISHED, or were published within it."))
	if err != nil {
		return nil, err
	}
	_, err = meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		if h := r.horizon.Load(); h != 0 {
			o.ObserveFloat64(horizon, time.Until(time.Unix(h, 0)).Seconds())
			o.ObserveInt64(held, r.heldPartitions.Load())
		}
		o.ObserveInt64(inFlight, r.pipe.InFlight())
		o.ObserveInt64(connected, boolInt(r.connected.Load()))
		if check := r.readers.Load(); check != nil {
			for typ := range r.cfg.Readers {
				o.ObserveInt64(missingReaders, int64(len(check.missing[typ])), metric.WithAttributes(messaging.AttrMessageType.String(typ)))
			}
		}
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		stats, err := queries.OutboxStats(ctx, r.pool)
		if err != nil {
			return err
		}
		// Every known type is reported, at zero when it has no rows.
		counts := map[string]map[string]int64{"PENDING": {}, "PUBLISHING": {}, "FAILED": {}}
		for _, typ := range r.cfg.MessageTypes {
			for status := range counts {
				counts[status][typ] = 0
			}
		}
		var oldestAge time.Duration
		for _, s := range stats {
			counts[s.Status][s.MessageType] = s.RowCount
			if s.Status == "PENDING" {
				oldestAge = max(oldestAge, time.Duration(s.OldestAgeSeconds*float64(time.Second)))
			}
		}
		for status, gauge := range map[string]metric.Int64ObservableGauge{"PENDING": pending, "PUBLISHING": publishing, "FAILED": failedRows} {
			for typ, n := range counts[status] {
				o.ObserveInt64(gauge, n, metric.WithAttributes(messaging.AttrMessageType.String(typ)))
			}
		}
		o.ObserveFloat64(oldest, oldestAge.Seconds())
		return nil
	}, pending, oldest, publishing, failedRows, inFlight, connected, missingReaders, horizon, held)
	if err != nil {
		return nil, err
	}
	// The outbox table's bloat, and the horizon that keeps vacuum from
	// removing it (the consumers report the same horizon).
	if err := tablestats.Register(meter, r.pool, TableName); err != nil {
		return nil, err
	}
	return &m, nil
}

func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}
