// Package outbox is the transactional outbox: messages are rows of
// message_outbox, written in the transaction of the change they announce,
// and published to RabbitMQ by the relay after that transaction commits.
//
// Writing (write.go) is one statement in the caller's transaction:
//
//	writer := outbox.Writer{Producer: "order-api", Exchange: "orders.events", AggregateType: "order"}
//	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
//		order, err := store.CreateOrder(ctx, tx, o, cause)
//		if err != nil {
//			return err
//		}
//		_, err = writer.Write(ctx, tx, cause, OrderSubmitted{ID: order.ID()})
//		return err
//	})
//
// A message is any type with a MessageType (its routing key), a
// MessageVersion and an AggregateID (messaging.Message); its JSON is the
// body.
//
// A statement trigger sends NOTIFY message_outbox on commit, naming its rows'
// aggregates, which wakes the relays holding their partitions (listen.go);
// a poll tick covers lost notifications.
//
// The relay (relay.go) runs one session per broker connection; read
// session.run first: it names the four steps every batch goes through, in
// order, and the loop that runs each. It claims due PENDING rows with FOR
// UPDATE SKIP LOCKED and a lease (rows.go, queries/outbox.sql), publishes
// them on one confirm channel with mandatory set and the confirms
// pipelined, awaits the confirms and says what became of each row (the
// Publisher of package internal/pipeline, which the log-tailing relay
// shares), and marks each row by it (mark.go): PUBLISHED when confirmed; back to PENDING with a backoff on
// a return, a nack or no confirm in time; FAILED after the last attempt. Every mark names the
// attempt that claimed the row, so a relay whose lease ran out cannot
// overwrite a newer claim, and a vanished relay's rows come back when its
// lease ends. Run as many relays as you like.
//
// mandatory cannot tell that one reader of a type missed a message another
// took, and AMQP cannot show a binding; so before it publishes a type, the
// relay finds each of its readers' queues and binds it as its consumer
// does (Config.Readers, readers.go), holding the type while one is missing.
//
// The log-tailing relay (package wal, RELAY_MODE=wal) publishes the same
// rows from PostgreSQL's write-ahead log instead of claiming them. Only
// the source of rows is its own: it publishes and records through the
// polling relay's pipeline (Relay.Pipeline), and runs a polling relay
// beside it as its sweep (Relay.ClaimOnlyBefore). A team
// that only polls deletes that folder and its wiring in cmd/outbox-relay.
//
// Tests and drills inject failures through Config.Faults, called from one
// line of the pipeline's Record, before the marks; production leaves it nil. The
// relays' shared test suite and the fixtures of other packages' tests are
// package outboxtest; the statements' test seams (ClaimRows, Mark, ...)
// are in export_test.go.
//
// message_outbox is range-partitioned on created_at: its time partitions
// (timepartition.go), which the relays make ahead and retention drops
// whole once every row of one is PUBLISHED and past Config.Retention.
//
// The rest of the code reads message_outbox through package outboxadmin
// (Aggregate, Failed, Stuck, Stats, Get), never with SQL of its own.
//
// docs/outbox-relay.md draws the relay; docs/state-machines.md the row's
// life cycle; metrics.go lists the relay's instruments.
package outbox
