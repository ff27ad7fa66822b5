// Package domain is the order model of the service, with no knowledge of
// PostgreSQL, RabbitMQ or HTTP: the order and its validating constructor, the
// order state machine, the message types with their versioned payloads, and
// the sentinel errors the other packages translate to and from.
//
// The state machine lives in statemachine.go as a table you can read at a
// glance; docs/state-machines.md draws it.
package domain
