// Package consumer holds the three consumers of the order service, each a
// messaging.Handler run by the same delivery wrapper (inbox row, guarded
// transition, follow-up outbox rows, ack after commit):
//
//	fulfillment    order.submitted -> FULFILLMENT_REQUESTED, emits fulfillment.requested;
//	               fulfillment.completed / .rejected -> FULFILLED / REJECTED, emits order.fulfilled / .rejected
//	warehouse      fulfillment.requested -> a stock reservation, answers fulfillment.completed,
//	               or .rejected when a sku starts with "OOS-"; order.cancelled -> releases it
//	notification   order.submitted, .cancelled, .fulfilled, .rejected -> one customer
//	               notification per (order, kind), delivered to a webhook with an Idempotency-Key
//
// The handlers hold no acknowledgement logic: they change the database in
// the transaction they are given and say what they did.
package consumer

import (
	"fmt"

	"go.opentelemetry.io/otel/metric"

	"github.com/yourorg/orders/internal/messaging"
)

// Names of the consumers (their consumer_name and queue suffix).
const (
	NameFulfillment  = "fulfillment"
	NameWarehouse    = "warehouse"
	NameNotification = "notification"
)

// Names lists every consumer, in the order of the flow.
var Names = []string{NameFulfillment, NameWarehouse, NameNotification}

// Config configures the consumers.
type Config struct {
	// Notifier configures the notification webhook.
	Notifier NotifierConfig
	// MeterProvider receives the consumers' business metrics (default: the
	// global one).
	MeterProvider metric.MeterProvider
}

// Specs returns the consumers named in names.
func Specs(names []string, cfg Config) ([]messaging.ConsumerSpec, error) {
	var specs []messaging.ConsumerSpec
	for _, name := range names {
		switch name {
		case NameFulfillment:
			f, err := Fulfillment(cfg.MeterProvider)
			if err != nil {
				return nil, err
			}
			specs = append(specs, f)
		case NameWarehouse:
			specs = append(specs, Warehouse())
		case NameNotification:
			specs = append(specs, Notification(cfg.Notifier))
		default:
			return nil, fmt.Errorf("unknown consumer %q", name)
		}
	}
	return specs, nil
}
