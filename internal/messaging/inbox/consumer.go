package inbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/yourorg/orders/internal/messaging"
)

// Consumer is one consumer: its name (its consumer_name in the inbox and
// the name of its queues) and a handler for each message it reads. The
// handlers are the single source of what the consumer reads: its queue
// bindings, its metrics' label values and the dispatch of each delivery
// all come from them, so none of these can drift from the code.
//
//	c := inbox.NewConsumer("shipping")
//	inbox.Handle(c, func(ctx context.Context, tx pgx.Tx, d *inbox.Delivery, m OrderFulfilledV1) (inbox.Outcome, error) {
//		// change the database in tx; say what you did
//		return inbox.Applied(), nil
//	})
type Consumer struct {
	name     string
	handlers map[handlerKey]handler
	waits    map[string]time.Duration // by message type: see Wait
}

// handlerKey names one version of one message type.
type handlerKey struct {
	typ     string
	version int
}

// handler reads and runs the deliveries of one (type, version).
type handler struct {
	// decode reads a body into the handler's message type.
	decode func(body []byte) (messaging.Message, error)
	// run runs a delivery whose Message decode made.
	run func(ctx context.Context, tx pgx.Tx, d *Delivery) (Outcome, error)
}

// NewConsumer returns a consumer named name, with no handlers yet.
func NewConsumer(name string) *Consumer {
	return &Consumer{name: name, handlers: map[handlerKey]handler{}, waits: map[string]time.Duration{}}
}

// Wait makes the consumer wait d after it receives a message of type M
// and before it processes it, outside any transaction and holding no lock
// or connection: a demo knob that leaves time to act by hand between a
// message and its effect (the order service's FULFILLMENT_DELAY, to cancel
// an order before its fulfillment is requested). A worker waits with its
// delivery unacknowledged; when the consumer stops meanwhile, the delivery
// comes again. A consumer that waits for some type takes its deliveries
// one at a time, never in batches, so that each waits its own time. 0 waits
// not at all.
func Wait[M messaging.Message](c *Consumer, d time.Duration) {
	var zero M
	if d > 0 {
		c.waits[zero.MessageType()] = d
	}
}

// Handle registers h for the messages of type M: one version of one
// message type, whose JSON encoding is the body. The handler gets the
// payload decoded and typed; it runs in the transaction that holds the
// message's inbox row, and knows nothing of acknowledgements: the consumer
// commits, acknowledges, retries or parks by what it returns. Wrap an
// error with Permanent when no retry can help.
//
// A body is decoded as one JSON value into M (unknown fields are ignored:
// a newer producer may add optional ones); when M has a method Validate()
// error, a body it refuses is malformed. Either way the message is parked
// as malformed_message, with the reason.
//
// Registering a type twice on one consumer is a programming error: Handle
// panics, at start-up.
func Handle[M messaging.Message](c *Consumer, h func(ctx context.Context, tx pgx.Tx, d *Delivery, m M) (Outcome, error)) {
	var zero M
	k := handlerKey{zero.MessageType(), zero.MessageVersion()}
	if _, dup := c.handlers[k]; dup {
		panic(fmt.Sprintf("inbox: consumer %s registers %s version %d twice", c.name, k.typ, k.version))
	}
	c.handlers[k] = handler{
		decode: decodeAs[M],
		run: func(ctx context.Context, tx pgx.Tx, d *Delivery) (Outcome, error) {
			return h(ctx, tx, d, d.Message.(M)) // decodeAs[M] made it
		},
	}
}

// decodeAs reads body as a message of type M (see Handle).
func decodeAs[M messaging.Message](body []byte) (messaging.Message, error) {
	var m M
	malformed := func(err error) error {
		return Permanent("malformed_message", fmt.Errorf("%s version %d: %w", m.MessageType(), m.MessageVersion(), err))
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&m); err != nil {
		return nil, malformed(err)
	}
	if dec.More() {
		return nil, malformed(errors.New("data after the JSON value"))
	}
	if v, ok := any(m).(interface{ Validate() error }); ok {
		if err := v.Validate(); err != nil {
			return nil, malformed(err)
		}
	}
	return m, nil
}

// Name is the consumer's name.
func (c *Consumer) Name() string { return c.name }

// Types lists the message types the consumer reads, sorted: the routing
// keys its queue is bound to.
func (c *Consumer) Types() []string {
	var types []string
	for k := range c.handlers {
		if !slices.Contains(types, k.typ) {
			types = append(types, k.typ)
		}
	}
	slices.Sort(types)
	return types
}

// handlerOf finds the handler of a delivery. A type the consumer does not
// read, or a version it has no handler for, is a permanent failure.
func (c *Consumer) handlerOf(d *Delivery) (handler, error) {
	if h, ok := c.handlers[handlerKey{d.Type, d.Version}]; ok {
		return h, nil
	}
	if slices.Contains(c.Types(), d.Type) {
		return handler{}, Permanent("unsupported_version", fmt.Errorf("consumer %s has no handler for %s version %d", c.name, d.Type, d.Version))
	}
	return handler{}, Permanent("unknown_type", fmt.Errorf("consumer %s does not handle %q", c.name, d.Type))
}
