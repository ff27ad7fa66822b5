// Package timeline reads the whole story of one order, every hop of the
// flow in time order: the API's creation (and cancel), each outbox row and
// its publish by the relay, each consumer's inbox row, every state
// transition, and the customer notifications, with the trace id that ties
// them together.
//
// It only reads, across the tables of several packages (store, outbox,
// inbox, the notification consumer), so it keeps its SQL here rather than
// in any of theirs; it writes nothing. Run Read in one read-only
// transaction, so that every table is read in the same snapshot:
//
//	err := pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly},
//		func(tx pgx.Tx) error {
//			tl, err = timeline.Read(ctx, tx, orderID)
//			return err
//		})
//
// order-api's page /ui/orders/{order_id} renders it (internal/httpapi);
// any other tool that shows an order's story can use the same function.
package timeline
