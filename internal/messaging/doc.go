// Package messaging holds the two mechanisms this project exists to show,
// and what they share. They know nothing of orders: the order service
// (internal/domain, store, consumer, httpapi) is built on them, as any
// other service would be.
//
//   - outbox (internal/messaging/outbox): a change and the messages it
//     announces commit in one PostgreSQL transaction (Writer.Write); the
//     relay claims the committed rows (FOR UPDATE SKIP LOCKED, with a
//     lease), publishes them with publisher confirms and mandatory set, and
//     marks each row by what the broker answered. Nothing committed is
//     lost; a message may be published twice, never with two ids.
//   - inbox (internal/messaging/inbox): each consumer records every message
//     it handles in message_inbox, in the same transaction as the message's
//     effect and its follow-up messages, and acknowledges only after that
//     commit; a duplicate finds its row and changes nothing. Failures go
//     round delayed-retry queues or to a parking lot with their reason.
//
// This package holds what both share: what a message is (Message, Cause),
// the envelope's header names, the connection (Dial, Open) and the
// exchange, the trace-context carrier, the metric helpers, and Deps, what
// the relay and the consumers run on. Below them stand only
// internal/database (the PostgreSQL edge), internal/background (the
// reconnect and retention loops) and internal/logctx.
// docs/architecture.md follows one order through all of it.
package messaging
