// Package wal is the log-tailing outbox relay (RELAY_MODE=wal). Instead of
// claiming rows, it reads the outbox's INSERTs from PostgreSQL's
// write-ahead log through a logical replication slot of its own (pgoutput, publication
// orders_outbox), publishes each message under confirms and mandatory, and
// tells the slot a transaction is done (its end LSN "flushed") only once
// every message of it, and of every transaction before it, is confirmed and
// written back. So a message costs the database its INSERT, one row update
// written back in batches, and nothing else.
//
// It stores nothing it trusts over the slot. The write-back (PUBLISHED, or
// PENDING with the broker's refusal in last_error) is for the operators'
// views and for the sweep; the slot alone says where the stream resumes,
// and it always resumes from the slot's own confirmed position (start LSN
// 0/0), never from one the relay remembers.
//
// Only the rows' source is its own (stream.go: read session's doc first):
// it publishes and records through the polling relay's pipeline
// (outbox.Relay.Pipeline: a Publisher, and Record). Beside the stream runs a
// sweep: the polling relay (outbox.Relay.ClaimOnlyBefore) restricted
// to rows the stream has handed over (their last publish failed: a return
// or a nack, retried with the usual attempts, backoff and FAILED) or
// missed (written SweepAfter before the newest transaction the stream has
// finished, and still PENDING). The sweep runs only while this relay
// streams.
//
// A slot the relay makes (at its first start, or when the slot was
// dropped or lost) starts at the end of the log. The PENDING rows
// committed before it, read through the snapshot the slot exports, go out
// first, in write order, ahead of its first transaction (passBacklog), so
// that nothing waits for the sweep and an aggregate's earlier rows still
// go first; a slot missing where one was expected is an error in the log,
// counted (relay.wal.slot.missing) with those rows. Making a slot waits
// for every transaction that holds an xid. A slot older than the
// publication (made before the migrations ran, as Patroni makes a
// permanent slot as soon as the database exists) can never be decoded:
// the relay drops it and makes it again, the same way.
//
// Like the polling relay's claim, the stream keeps each aggregate's
// messages in the order they were written, and with Config.Partitions
// stamps each with its partition (outbox.PartitionOf), so that partitioned
// consumers get an order's messages in order in both modes.
//
// One relay streams a slot at a time; a second one finds the slot active,
// stands by, and takes over when the first one's connection goes.
// docs/outbox-relay.md compares the two designs. A team that only polls
// deletes this folder and its wiring in cmd/outbox-relay.
package wal
