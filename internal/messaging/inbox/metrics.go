package inbox

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/yourorg/orders/internal/messaging"
	"github.com/yourorg/orders/internal/messaging/tablestats"
)

var (
	attrConsumer = attribute.Key("consumer_name")
	attrCode     = attribute.Key("reason_code")
	attrStatus   = attribute.Key("status")
)

// consumerMetrics are the consumers' instruments (docs/observability.md).
type consumerMetrics struct {
	received, redelivered, processed, duplicates, retried        metric.Int64Counter
	permanent, poisoned, parked, requeued, held, payloadMismatch metric.Int64Counter
	duration, txDuration                                         metric.Float64Histogram
	attempt, batchSize                                           metric.Int64Histogram
}

// zero starts the counters of a consumer at zero for every label value
// known in advance, so that rate() and alerts see a series before the
// first event. (Reason codes are not known in advance.)
func (m *consumerMetrics) zero(c *Consumer) {
	ctx := context.Background()
	consumer := attrConsumer.String(c.name)
	for _, typ := range c.Types() {
		attrs := metric.WithAttributes(consumer, messaging.AttrMessageType.String(typ))
		m.received.Add(ctx, 0, attrs)
		m.redelivered.Add(ctx, 0, attrs)
		m.duplicates.Add(ctx, 0, attrs)
		for _, outcome := range []string{"processed", "ignored"} {
			m.processed.Add(ctx, 0, metric.WithAttributes(consumer, messaging.AttrMessageType.String(typ), messaging.AttrOutcome.String(outcome)))
		}
	}
	for _, c := range []metric.Int64Counter{m.poisoned, m.requeued, m.held, m.payloadMismatch} {
		c.Add(ctx, 0, metric.WithAttributes(consumer))
	}
}

func newConsumerMetrics(meter metric.Meter, cs *Consumers) (*consumerMetrics, error) {
	var (
		m   consumerMetrics
		err error
	)
	mc := &messaging.Counters{Meter: meter}
	counter := mc.Counter
	m.received = counter("consumer.messages.received", "Deliveries received, by consumer and message type.")
	m.redelivered = counter("consumer.messages.redelivered", "Deliveries the broker marked redelivered (delivered before, not acknowledged).")
	m.processed = counter("consumer.messages.processed", "Messages processed and acknowledged, by outcome: processed (applied) or ignored (stale).")
	m.duplicates = counter("consumer.messages.duplicates", "Deliveries of messages already PROCESSED: acknowledged, nothing applied.")
	m.retried = counter("consumer.messages.retried", "Transient failures sent to a retry queue, by reason code.")
	m.permanent = counter("consumer.messages.permanent_failures", "Permanent failures (invalid message, impossible transition), by reason code.")
	m.poisoned = counter("consumer.messages.poisoned", "Messages whose retries ran out.")
	m.parked = counter("consumer.messages.parked", "Messages moved to the parking lot, by reason code.")
	m.requeued = counter("consumer.messages.requeued", "Deliveries given back to the broker because their failure could not be recorded or moved on.")
	m.held = counter("consumer.messages.held", "Deliveries held (unacknowledged, retried in place) because the database was unavailable.")
	m.payloadMismatch = counter("consumer.inbox.payload_mismatch", "Duplicates whose body differs from the first delivery: a producer reused a message_id.")
	if mc.Err != nil {
		return nil, mc.Err
	}
	if m.duration, err = meter.Float64Histogram("consumer.processing.duration", metric.WithUnit("s"), messaging.SecondsBuckets,
		metric.WithDescription("From receiving a delivery to acknowledging it, by consumer and outcome (processed, ignored, duplicate, retried, parked).")); err != nil {
		return nil, err
	}
	if m.txDuration, err = meter.Float64Histogram("consumer.db.transaction.duration", metric.WithUnit("s"), messaging.SecondsBuckets,
		metric.WithDescription("Duration of each processing transaction.")); err != nil {
		return nil, err
	}
	if m.attempt, err = meter.Int64Histogram("inbox.attempt", metric.WithExplicitBucketBoundaries(1, 2, 3, 5, 10, 20),
		metric.WithDescription("The processing attempt of each message as it starts (1 = first).")); err != nil {
		return nil, err
	}
	if m.batchSize, err = meter.Int64Histogram("consumer.batch.size", metric.WithExplicitBucketBoundaries(1, 2, 4, 8, 16, 32, 64),
		metric.WithUnit("{message}"), metric.WithDescription("Deliveries a worker took together, to apply in one transaction, by consumer.")); err != nil {
		return nil, err
	}

	rows, err := meter.Int64ObservableGauge("inbox.rows", metric.WithUnit("{message}"),
		metric.WithDescription("Inbox rows not PROCESSED, by consumer and status (PROCESSING, RETRYABLE_FAILED, PERMANENT_FAILED, POISONED)."))
	if err != nil {
		return nil, err
	}
	oldest, err := meter.Float64ObservableGauge("inbox.oldest_unprocessed_age", metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest inbox row not PROCESSED, by consumer."))
	if err != nil {
		return nil, err
	}
	processingAge, err := meter.Float64ObservableGauge("inbox.processing_age", metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest committed PROCESSING row (a two-step side effect in progress, or stuck), by consumer."))
	if err != nil {
		return nil, err
	}
	horizon, err := meter.Float64ObservableGauge("inbox.time_partitions.horizon", metric.WithUnit("s"),
		metric.WithDescription("Time until the last time partition of message_inbox ends: a delivery after it fails."))
	if err != nil {
		return nil, err
	}
	held, err := meter.Int64ObservableGauge("inbox.time_partitions.held", metric.WithUnit("{partition}"),
		metric.WithDescription("Time partitions past the inbox retention that retention cannot drop yet: rows of theirs are not PROCESSED, or were processed within it."))
	if err != nil {
		return nil, err
	}
	_, err = meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		if h := cs.horizon.Load(); h != 0 {
			o.ObserveFloat64(horizon, time.Until(time.Unix(h, 0)).Seconds())
			o.ObserveInt64(held, cs.heldPartitions.Load())
		}
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		stats, err := queries.InboxStats(ctx, cs.pool)
		if err != nil {
			return err
		}
		// Every consumer of this process and every status not PROCESSED is
		// reported, at zero when it has no rows.
		type key struct{ consumer, status string }
		counts := map[key]int64{}
		oldestBy, processingBy := map[string]time.Duration{}, map[string]time.Duration{}
		for _, s := range cs.subscriptions {
			name := s.consumer.name
			oldestBy[name], processingBy[name] = 0, 0
			for _, status := range []string{StatusProcessing, StatusRetryableFailed, StatusPermanentFailed, StatusPoisoned} {
				counts[key{name, status}] = 0
			}
		}
		for _, s := range stats {
			age := time.Duration(s.OldestAgeSeconds * float64(time.Second))
			counts[key{s.ConsumerName, s.Status}] = s.RowCount
			oldestBy[s.ConsumerName] = max(oldestBy[s.ConsumerName], age)
			if s.Status == StatusProcessing {
				processingBy[s.ConsumerName] = age
			}
		}
		for k, n := range counts {
			o.ObserveInt64(rows, n, metric.WithAttributes(attrConsumer.String(k.consumer), attrStatus.String(k.status)))
		}
		for consumer, age := range oldestBy {
			o.ObserveFloat64(oldest, age.Seconds(), metric.WithAttributes(attrConsumer.String(consumer)))
			o.ObserveFloat64(processingAge, processingBy[consumer].Seconds(), metric.WithAttributes(attrConsumer.String(consumer)))
		}
		return nil
	}, rows, oldest, processingAge, horizon, held)
	if err != nil {
		return nil, err
	}
	// The inbox table's bloat, and the horizon that keeps vacuum from
	// removing it (the relays report the same horizon).
	if err := tablestats.Register(meter, cs.pool, TableName); err != nil {
		return nil, err
	}
	return &m, nil
}
