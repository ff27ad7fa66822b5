package consumer

import (
	"fmt"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/yourorg/orders/internal/consumer/fulfillment"
	"github.com/yourorg/orders/internal/consumer/notification"
	"github.com/yourorg/orders/internal/consumer/shipping"
	"github.com/yourorg/orders/internal/consumer/warehouse"
	"github.com/yourorg/orders/internal/domain"
	"github.com/yourorg/orders/internal/domain/schema"
	"github.com/yourorg/orders/internal/messaging/inbox"
	"github.com/yourorg/orders/internal/messaging/outbox"
	"github.com/yourorg/orders/internal/store"
)

// Deps is what the consumers take from the process that runs them.
type Deps struct {
	// MeterProvider receives the consumers' business metrics (default: the
	// global one).
	MeterProvider metric.MeterProvider
	// Notifier configures the notification webhook.
	Notifier notification.Config
	// FulfillmentDelay is how long fulfillment waits before it requests
	// the fulfillment of a submitted order (FULFILLMENT_DELAY, a demo
	// knob); 0: no wait.
	FulfillmentDelay time.Duration
	// OrderFulfilledVersion is the version of order.fulfilled fulfillment
	// writes (ORDER_FULFILLED_VERSION); 0: version 1.
	OrderFulfilledVersion int
}

// All returns every consumer of order-consumer, in the order of the flow.
// Adding a consumer is one line here (docs/extending.md).
func All(d Deps) []*inbox.Consumer {
	return []*inbox.Consumer{
		fulfillment.New(fulfillment.Config{MeterProvider: d.MeterProvider, Delay: d.FulfillmentDelay, FulfilledVersion: d.OrderFulfilledVersion}),
		warehouse.New(),
		notification.New(d.Notifier),
		shipping.New(),
	}
}

// Names lists the names of every consumer, in the order of All.
func Names() []string {
	var names []string
	for _, c := range All(Deps{}) {
		names = append(names, c.Name())
	}
	return names
}

// Readers lists, by message type, the work queues (with partitions, the
// partition queues) of every consumer that reads it, with their bindings:
// what the relay checks and binds before it publishes a message of that
// type (outbox.Config.Readers).
func Readers(partitions int) map[string][]outbox.Reader {
	readers := map[string][]outbox.Reader{}
	for _, c := range All(Deps{}) {
		t := inbox.Topology{Consumer: c.Name(), Exchange: domain.EventsExchange, Types: c.Types(), Partitions: partitions}
		for typ, rs := range t.Readers() {
			readers[typ] = append(readers[typ], rs...)
		}
	}
	return readers
}

// Select returns the consumers of all that names lists, in the order of
// all; no names selects every one. A name that is not a consumer is an
// error that lists the names there are.
func Select(all []*inbox.Consumer, names []string) ([]*inbox.Consumer, error) {
	if len(names) == 0 {
		return all, nil
	}
	byName := map[string]*inbox.Consumer{}
	var known []string
	for _, c := range all {
		byName[c.Name()] = c
		known = append(known, c.Name())
	}
	want := map[string]bool{}
	for _, n := range names {
		if byName[n] == nil {
			return nil, fmt.Errorf("unknown consumer %q (there are %v)", n, known)
		}
		want[n] = true
	}
	var out []*inbox.Consumer
	for _, c := range all {
		if want[c.Name()] {
			out = append(out, c)
		}
	}
	return out, nil
}

// Producer is the app_id of the follow-up messages the consumers write.
const Producer = "order-consumer"

// Inbox completes cfg with what every consumer of the order service
// shares: the exchange their queues are bound to (domain.EventsExchange),
// the writer of their follow-up messages, and the message contract: every
// body is checked against the JSON Schema of its type and version
// (internal/domain/schema, published in api/asyncapi.yaml) before it is
// decoded, and one that breaks it is parked as schema_violation.
func Inbox(cfg inbox.Config) inbox.Config {
	cfg.Exchange = domain.EventsExchange
	cfg.FollowUps = store.OutboxWriter(Producer)
	cfg.ValidateBody = schema.Validate
	return cfg
}
