// Package messaging is the RabbitMQ side of the service.
//
// The outbox relay (relay.go) turns committed message_outbox rows into AMQP
// messages: it claims due rows with FOR UPDATE SKIP LOCKED, publishes them on
// one long-lived channel in confirm mode with mandatory set and the
// confirms pipelined, and marks each row by what the broker answered. A
// basic.return (no queue bound), a nack or a missing confirm sends the row
// back to PENDING with a backoff; after the last attempt it is FAILED.
//
// The envelope every message carries is in envelope.go (SPEC section 5).
package messaging
