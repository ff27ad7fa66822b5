// Package inbox is the consumer side: a delivery wrapper that applies each
// message at most once per consumer, whatever the duplicates, redeliveries,
// crashes and replays, and never loses one.
//
// A consumer (consumer.go) is a name and one typed handler per message
// type it reads; a message is any type with a MessageType, a
// MessageVersion and an AggregateID (messaging.Message), whose JSON is the
// body:
//
//	c := inbox.NewConsumer("shipping")
//	inbox.Handle(c, func(ctx context.Context, tx pgx.Tx, d *inbox.Delivery, m OrderFulfilledV1) (inbox.Outcome, error) {
//		// change the database in tx only
//		return inbox.Applied(), nil
//	})
//
// Consumers (consumers.go) runs a process's consumers, each subscribed to
// its own queues (topology.go) with Workers workers. Read worker.handle
// first: it is the whole promise, top to bottom,
//
//	open the deliveries -> BEGIN -> inbox rows (insert, or find: a
//	duplicate) -> handlers -> follow-up outbox rows -> COMMIT -> ack
//
// for a batch of deliveries (a single one is a batch of one). The inbox
// row (rows.go, queries/inbox.sql) is keyed on (consumer_name, message_id),
// kept unique by a transaction-scoped advisory lock on the pair, since
// message_inbox is partitioned by time (timepartition.go) and its key
// must hold first_received_at; a concurrent delivery of the same message
// waits on that lock. A failure
// (failure.go) is recorded on the row and classified: transient ones go
// round delayed-retry queues, permanent ones and exhausted retries to the
// consumer's parking lot with headers that say why; the delivery is
// acknowledged only once the message is safely somewhere else. An effect
// outside the database (a webhook) takes two transactions (external.go).
// Package inboxadmin holds the operator's side of the parking lots: Replay
// moves parked messages back, keeping their ids; Browse and Discard look
// at them without moving them, and remove one for good.
//
// Tests and drills inject failures through Config.Faults, called from one
// line between a delivery's commit and its ack; production leaves it nil.
//
// The rest of the code reads message_inbox through inboxadmin too (Get,
// Aggregate, Unprocessed, Stats), never with SQL of its own.
//
// docs/messaging.md draws the queues and the wrapper; docs/extending.md is
// the recipe for a new consumer.
package inbox
