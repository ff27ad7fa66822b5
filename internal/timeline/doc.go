// Package timeline reads the whole story of one order, every hop of the
// flow in time order: the API's creation (and cancel), each outbox row and
// its publish by the relay, each consumer's inbox row, every state
// transition, and the customer notifications, with the trace id that ties
// them together.
//
// It only reads; it writes nothing. The outbox and inbox rows come from
// the mechanisms' read APIs (outboxadmin.Aggregate, inboxadmin.Aggregate),
// which give order-api's role, which may read neither table, one order's
// rows through the mechanisms' read functions (docs/security.md). Run Read in one read-only transaction, so that every
// table is read in the same snapshot (the functions read in the caller's):
//
//	err := pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly},
//		func(tx pgx.Tx) error {
//			tl, err = timeline.Read(ctx, tx, orderID)
//			return err
//		})
//
// order-api's page /ui/orders/{order_id} renders it (internal/httpapi);
// any other tool that shows an order's story can use the same function,
// with orders_api's role or one that may read the tables.
package timeline
