// Package store is the PostgreSQL side of the order: migrating its
// database (Migrator: the outbox's, the inbox's and the service's schemas),
// the orders with their items and history, and the HTTP idempotency keys. It stands on internal/database (the pool, DBTX, the
// classification of driver errors), as the outbox and the inbox do; they
// keep their own tables and SQL (internal/messaging/outbox,
// internal/messaging/inbox).
//
// Every function takes a DBTX (a pool, a connection or a transaction), so the
// caller decides the transaction and it stays visible where it matters:
// the order and the message announcing it commit together, or neither does
// (ExampleCreateOrder):
//
//	cause := domain.Cause{CorrelationID: correlationID}
//	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
//		created, err := store.CreateOrder(ctx, tx, order, cause)
//		if err != nil {
//			return err
//		}
//		_, err = writer.Write(ctx, tx, cause, domain.SubmittedMessage(created))
//		return err
//	})
//
// The SQL lives in queries/*.sql and is compiled to typed Go by sqlc into
// dbsqlc (make generate). Driver errors are translated into the domain's
// words here (Translate): no row becomes domain.ErrNotFound and a unique
// violation domain.ErrConflict.
package store
