// Package store is the PostgreSQL side of the service: the connection pool,
// the schema migrations, and the reads and writes of orders, the outbox, the
// inbox and HTTP idempotency keys.
//
// Every function takes a DBTX (a pool, a connection or a transaction), so the
// caller decides the transaction and it stays visible where it matters:
//
//	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
//		if err := store.CreateOrder(ctx, tx, order, meta); err != nil {
//			return err
//		}
//		_, err := store.EnqueueMessages(ctx, tx, meta, domain.SubmittedMessage(order))
//		return err
//	})
//
// The SQL lives in queries/*.sql and is compiled to typed Go by sqlc into
// dbsqlc (make generate). Driver errors are translated here, at the edge:
// no row becomes domain.ErrNotFound and a unique violation domain.ErrConflict.
package store
