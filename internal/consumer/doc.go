// Package consumer lists the consumers of order-consumer. Each lives in a
// folder of its own, with its handlers, its own tables' SQL and its tests:
//
//	fulfillment    order.submitted -> FULFILLMENT_REQUESTED, emits fulfillment.requested;
//	               fulfillment.completed / .rejected -> FULFILLED / REJECTED, emits order.fulfilled / .rejected
//	warehouse      fulfillment.requested -> a stock reservation, answers fulfillment.completed,
//	               or .rejected when a sku starts with "OOS-"; order.cancelled -> releases it
//	notification   order.submitted, .cancelled, .fulfilled, .rejected -> one customer
//	               notification per (order, kind), delivered to a webhook with an Idempotency-Key
//	shipping       order.fulfilled -> one shipment per order, ready for the carrier
//
// Every consumer is an inbox.Consumer: a name and one typed handler per
// message type it reads, run by the same delivery wrapper (inbox row,
// handler, follow-up outbox rows, commit, then ack). The handlers hold no
// acknowledgement logic: they change the database in the transaction they
// are given and say what they did. docs/extending.md is the recipe for a
// new consumer; All is the one line it adds here.
package consumer
