// Package database is the PostgreSQL edge that every other package stands
// on: the DBTX interface that store functions and the outbox and inbox take
// (a pool, a connection or a transaction, so the caller decides the
// transaction), the connection pool of a process (NewPool), the one
// transaction runner (Run: a lost COMMIT's outcome checked, contention
// retried, an unavailable database waited for, each as its Policy says),
// the translation and classification of driver errors (Translate,
// IsTransient, IsUnavailable, IsFault), and the migrator that applies each
// package's goose migrations (Schema, Migrator: the outbox's, the inbox's,
// a service's).
//
// It knows nothing of orders or messages. The order service's store and the
// outbox and the inbox all use it; a team that keeps the outbox and the
// inbox keeps this package with them.
package database
