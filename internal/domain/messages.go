package domain

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"

	"github.com/google/uuid"
)

// Message types: the routing keys on the orders.events exchange.
const (
	TypeOrderSubmitted       = "order.submitted"
	TypeOrderCancelled       = "order.cancelled"
	TypeOrderFulfilled       = "order.fulfilled"
	TypeOrderRejected        = "order.rejected"
	TypeFulfillmentRequested = "fulfillment.requested"
	TypeFulfillmentCompleted = "fulfillment.completed"
	TypeFulfillmentRejected  = "fulfillment.rejected"
)

// EventsExchange is the one durable topic exchange every message goes
// through; the routing key is the message type.
const EventsExchange = "orders.events"

// AggregateOrder is the aggregate type of every message here.
const AggregateOrder = "order"

// Message is a payload this service publishes and consumes. Each type has a
// version; a change that old readers cannot ignore gets a new version and a
// new struct, and readers keep the old one until no old message can be
// replayed (see docs/messaging.md).
type Message interface {
	MessageType() string
	MessageVersion() int
	// OrderID is the aggregate the message is about: every payload has one.
	OrderID() uuid.UUID
	// AggregateID is OrderID as text: the outbox row's aggregate_id.
	AggregateID() string
	// Validate reports what a decoded payload lacks (order_id, at least).
	Validate() error
}

// ItemLine is an order line in a message.
type ItemLine struct {
	SKU            string `json:"sku"`
	Quantity       int    `json:"quantity"`
	UnitPriceCents int64  `json:"unit_price_cents"`
}

// OrderSubmittedV1: an order was accepted (order-api).
type OrderSubmittedV1 struct {
	ID         uuid.UUID  `json:"order_id"`
	CustomerID string     `json:"customer_id"`
	Currency   string     `json:"currency"`
	TotalCents int64      `json:"total_cents"`
	Items      []ItemLine `json:"items"`
}

// FulfillmentRequestedV1: fulfillment asks the warehouse to reserve stock.
type FulfillmentRequestedV1 struct {
	ID    uuid.UUID  `json:"order_id"`
	Items []ItemLine `json:"items"`
}

// FulfillmentCompletedV1: the warehouse reserved every line.
type FulfillmentCompletedV1 struct {
	ID            uuid.UUID `json:"order_id"`
	ReservationID uuid.UUID `json:"reservation_id"`
}

// FulfillmentRejectedV1: the warehouse could not reserve the order.
type FulfillmentRejectedV1 struct {
	ID     uuid.UUID `json:"order_id"`
	Reason string    `json:"reason"`
	SKUs   []string  `json:"skus,omitempty"`
}

// OrderCancelledV1: the order was cancelled through the API.
type OrderCancelledV1 struct {
	ID uuid.UUID `json:"order_id"`
}

// OrderFulfilledV1: the order reached FULFILLED.
type OrderFulfilledV1 struct {
	ID uuid.UUID `json:"order_id"`
}

// OrderRejectedV1: the order reached REJECTED.
type OrderRejectedV1 struct {
	ID     uuid.UUID `json:"order_id"`
	Reason string    `json:"reason"`
}

func (m OrderSubmittedV1) MessageType() string       { return TypeOrderSubmitted }
func (m FulfillmentRequestedV1) MessageType() string { return TypeFulfillmentRequested }
func (m FulfillmentCompletedV1) MessageType() string { return TypeFulfillmentCompleted }
func (m FulfillmentRejectedV1) MessageType() string  { return TypeFulfillmentRejected }
func (m OrderCancelledV1) MessageType() string       { return TypeOrderCancelled }
func (m OrderFulfilledV1) MessageType() string       { return TypeOrderFulfilled }
func (m OrderRejectedV1) MessageType() string        { return TypeOrderRejected }

func (OrderSubmittedV1) MessageVersion() int       { return 1 }
func (FulfillmentRequestedV1) MessageVersion() int { return 1 }
func (FulfillmentCompletedV1) MessageVersion() int { return 1 }
func (FulfillmentRejectedV1) MessageVersion() int  { return 1 }
func (OrderCancelledV1) MessageVersion() int       { return 1 }
func (OrderFulfilledV1) MessageVersion() int       { return 1 }
func (OrderRejectedV1) MessageVersion() int        { return 1 }

func (m OrderSubmittedV1) OrderID() uuid.UUID       { return m.ID }
func (m FulfillmentRequestedV1) OrderID() uuid.UUID { return m.ID }
func (m FulfillmentCompletedV1) OrderID() uuid.UUID { return m.ID }
func (m FulfillmentRejectedV1) OrderID() uuid.UUID  { return m.ID }
func (m OrderCancelledV1) OrderID() uuid.UUID       { return m.ID }
func (m OrderFulfilledV1) OrderID() uuid.UUID       { return m.ID }
func (m OrderRejectedV1) OrderID() uuid.UUID        { return m.ID }

func (m OrderSubmittedV1) AggregateID() string       { return m.ID.String() }
func (m FulfillmentRequestedV1) AggregateID() string { return m.ID.String() }
func (m FulfillmentCompletedV1) AggregateID() string { return m.ID.String() }
func (m FulfillmentRejectedV1) AggregateID() string  { return m.ID.String() }
func (m OrderCancelledV1) AggregateID() string       { return m.ID.String() }
func (m OrderFulfilledV1) AggregateID() string       { return m.ID.String() }
func (m OrderRejectedV1) AggregateID() string        { return m.ID.String() }

func (m OrderSubmittedV1) Validate() error       { return requireOrder(m.ID) }
func (m FulfillmentRequestedV1) Validate() error { return requireOrder(m.ID) }
func (m FulfillmentCompletedV1) Validate() error { return requireOrder(m.ID) }
func (m FulfillmentRejectedV1) Validate() error  { return requireOrder(m.ID) }
func (m OrderCancelledV1) Validate() error       { return requireOrder(m.ID) }
func (m OrderFulfilledV1) Validate() error       { return requireOrder(m.ID) }
func (m OrderRejectedV1) Validate() error        { return requireOrder(m.ID) }

// requireOrder is the rule every payload keeps: it names its order.
func requireOrder(id uuid.UUID) error {
	if id == uuid.Nil {
		return errors.New("order_id is missing")
	}
	return nil
}

// messageKey names one version of one message type.
type messageKey struct {
	typ     string
	version int
}

// catalogue is every message of this service, by type and version: its
// decoder, and an example payload with every field set. The examples are
// part of the contract: docs/catalog.md shows them, and a test checks that
// each decodes back to itself. A new message type, or a new version of
// one, is a line here (docs/extending.md).
var catalogue = map[messageKey]entry{
	{TypeOrderSubmitted, 1}: entryOf(OrderSubmittedV1{
		ID: exampleOrderID, CustomerID: "c-1", Currency: "EUR", TotalCents: 2500,
		Items: []ItemLine{{SKU: "A-1", Quantity: 2, UnitPriceCents: 1250}},
	}),
	{TypeFulfillmentRequested, 1}: entryOf(FulfillmentRequestedV1{
		ID: exampleOrderID, Items: []ItemLine{{SKU: "A-1", Quantity: 2, UnitPriceCents: 1250}},
	}),
	{TypeFulfillmentCompleted, 1}: entryOf(FulfillmentCompletedV1{ID: exampleOrderID, ReservationID: uuid.MustParse("0193a3c4-2f6e-7d1a-9b3c-4d5e6f708192")}),
	{TypeFulfillmentRejected, 1}:  entryOf(FulfillmentRejectedV1{ID: exampleOrderID, Reason: "out of stock", SKUs: []string{"OOS-1"}}),
	{TypeOrderCancelled, 1}:       entryOf(OrderCancelledV1{ID: exampleOrderID}),
	{TypeOrderFulfilled, 1}:       entryOf(OrderFulfilledV1{ID: exampleOrderID}),
	{TypeOrderRejected, 1}:        entryOf(OrderRejectedV1{ID: exampleOrderID, Reason: "out of stock"}),
}

// exampleOrderID is the order of every example.
var exampleOrderID = uuid.MustParse("0193a3c4-2f6e-7d1a-9b3c-4d5e6f708190")

// entry is one (type, version) of the catalogue.
type entry struct {
	decode  func([]byte) (Message, error)
	example Message
}

func entryOf[T Message](example T) entry { return entry{decode: decodeAs[T], example: example} }

// Examples returns the example payload of every (type, version) of the
// catalogue, sorted by type, then version.
func Examples() []Message {
	var out []Message
	for _, e := range catalogue {
		out = append(out, e.example)
	}
	slices.SortFunc(out, func(a, b Message) int {
		if c := cmp.Compare(a.MessageType(), b.MessageType()); c != 0 {
			return c
		}
		return cmp.Compare(a.MessageVersion(), b.MessageVersion())
	})
	return out
}

// MessageTypes lists every message type of this service, sorted.
func MessageTypes() []string {
	var types []string
	for k := range catalogue {
		if !slices.Contains(types, k.typ) {
			types = append(types, k.typ)
		}
	}
	slices.Sort(types)
	return types
}

// KnownMessageType reports whether typ is a message type of this service.
func KnownMessageType(typ string) bool {
	for k := range catalogue {
		if k.typ == typ {
			return true
		}
	}
	return false
}

// DecodeMessage reads the payload of a message of type typ and version.
// Unknown fields are ignored (a newer producer may add optional ones); a
// missing order_id is not, nor anything after the JSON value, nor a key
// that names a field only when case is ignored. The errors wrap
// ErrUnknownMessageType, ErrUnsupportedVersion or ErrMalformedMessage.
func DecodeMessage(typ string, version int, body []byte) (Message, error) {
	e, ok := catalogue[messageKey{typ, version}]
	if !ok {
		if KnownMessageType(typ) {
			return nil, fmt.Errorf("%w: %s version %d", ErrUnsupportedVersion, typ, version)
		}
		return nil, fmt.Errorf("%w: %q", ErrUnknownMessageType, typ)
	}
	msg, err := e.decode(body)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrMalformedMessage, typ, err)
	}
	if err := msg.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrMalformedMessage, typ, err)
	}
	return msg, nil
}

// decodeAs reads body into a T, refusing what two readers of the same
// bytes could read differently: the body must be one JSON value with
// nothing after it (json.Decoder.More does not see a stray "]" or "}"),
// and a key that names a field only when case is ignored ("ORDER_ID",
// which encoding/json takes for order_id and a case-sensitive reader
// ignores) is refused rather than read.
func decodeAs[T Message](body []byte) (Message, error) {
	var generic any
	if err := json.Unmarshal(body, &generic); err != nil {
		return nil, err
	}
	if err := exactKeys(generic, reflect.TypeFor[T](), ""); err != nil {
		return nil, err
	}
	var m T
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, err
	}
	return m, nil
}

// exactKeys returns an error naming the first key of v (decoded JSON, in
// key order) that matches the JSON name of a field of t at the same place
// only when case is ignored, as encoding/json matches them. A key that
// matches no field is left alone: readers ignore unknown fields.
func exactKeys(v any, t reflect.Type, path string) error {
	switch t.Kind() {
	case reflect.Struct:
		obj, ok := v.(map[string]any)
		if !ok {
			return nil // a type mismatch, which json.Unmarshal reported
		}
		fields := map[string]reflect.Type{}
		for f := range t.Fields() {
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "" {
				name = f.Name
			}
			if f.IsExported() && name != "-" {
				fields[name] = f.Type
			}
		}
		for _, key := range slices.Sorted(maps.Keys(obj)) {
			if ft, ok := fields[key]; ok {
				if err := exactKeys(obj[key], ft, path+key+"."); err != nil {
					return err
				}
				continue
			}
			for name := range fields {
				if strings.EqualFold(key, name) {
					return fmt.Errorf("key %q is not %q: field names are case-sensitive", path+key, path+name)
				}
			}
		}
	case reflect.Slice:
		arr, ok := v.([]any)
		if !ok {
			return nil
		}
		for i, val := range arr {
			if err := exactKeys(val, t.Elem(), fmt.Sprintf("%s[%d].", strings.TrimSuffix(path, "."), i)); err != nil {
				return err
			}
		}
	}
	return nil
}

// SubmittedMessage is the order.submitted message for a new order.
func SubmittedMessage(o *Order) OrderSubmittedV1 {
	return OrderSubmittedV1{
		ID: o.ID(), CustomerID: o.CustomerID(), Currency: o.Currency(),
		TotalCents: o.TotalCents(), Items: itemLines(o.Items()),
	}
}

func itemLines(items []Item) []ItemLine {
	lines := make([]ItemLine, len(items))
	for i, it := range items {
		lines[i] = ItemLine(it)
	}
	return lines
}
