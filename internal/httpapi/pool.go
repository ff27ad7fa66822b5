package httpapi

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// errOverloaded is a request turned away because the server is at its
// limit (every database connection busy, or too many requests in flight):
// a 503 with Retry-After, so that the client backs off instead of the
// server piling up goroutines that wait.
var errOverloaded = errors.New("overloaded")

// errCommitUnknown is a COMMIT cut off in flight whose outcome the server
// could not tell in time: the request may have taken effect. A 503 that
// says so, with Retry-After: a create retried with its Idempotency-Key
// finds its order if it is there.
var errCommitUnknown = errors.New("the outcome of the COMMIT is unknown")

// boundedPool runs the handlers' transactions on the pool, waiting at most
// acquireTimeout for a connection. pgxpool waits as long as the request's
// context lets it; under overload that is a goroutine, a request and a
// client waiting per request, all of them late.
type boundedPool struct {
	pool           *pgxpool.Pool
	acquireTimeout time.Duration
}

// inTx runs fn in a transaction with opts and commits it, as
// pgx.BeginTxFunc does, with one difference: a transaction that failed
// because its connection died (the server ended the session: a failover, a
// restart of a connection pooler, pg_terminate_backend; or the network cut
// it) is run again, once, on a connection that has just answered, when it
// is certain that the first run wrote nothing. The client then sees a
// slower answer instead of a 503. fn must be safe to run twice: it may set
// variables the handler reads after, as long as each run sets them afresh.
//
// When that is certain:
//   - the connection died before the COMMIT was sent: a session that ends
//     takes its open transaction with it;
//   - a read-only transaction, whatever its COMMIT did;
//   - the connection died after the COMMIT was sent, before its answer
//     came (a session killed while it waited for the COMMIT, or while it
//     ran it; a network cut): the outcome is unknown to the client, so
//     inTx asks the server on
//     another connection, with the transaction's id, what became of it
//     (pg_xact_status). Committed: the handler answers as if the COMMIT
//     had answered. Aborted: it is run again. Still in progress after
//     outcomeWait, 5 s (the session is alive but cut off from this
//     process): the outcome stays unknown, and the request is a 503 that says so
//     (errCommitUnknown); a retry with the same Idempotency-Key finds the
//     order if the COMMIT took effect.
//
// Never is a COMMIT of unknown outcome run again blindly: that could
// create a second order. Asking for the id costs a write transaction one
// round trip.
func (b boundedPool) inTx(ctx context.Context, opts pgx.TxOptions, fn func(pgx.Tx) error) error {
	err := b.tryTx(ctx, opts, false, fn)
	var lost *lostBeforeCommit
	if errors.As(err, &lost) && ctx.Err() == nil {
		err = b.tryTx(ctx, opts, true, fn)
	}
	return err
}

// lostBeforeCommit is a transaction whose connection died before it
// committed: the server rolled it back.
type lostBeforeCommit struct{ err error }

func (e *lostBeforeCommit) Error() string { return e.err.Error() }
func (e *lostBeforeCommit) Unwrap() error { return e.err }

// tryTx runs one transaction: on a connection that answers a ping first
// when fresh (a retry: the connections a failover cut die together, and
// the pool finds out only when it uses them).
func (b boundedPool) tryTx(ctx context.Context, opts pgx.TxOptions, fresh bool, fn func(pgx.Tx) error) error {
	conn, err := b.acquire(ctx, fresh)
	if err != nil {
		return err
	}
	defer conn.Release() // a dead connection is destroyed, not pooled
	// lost tells a failure that killed the connection.
	lost := func(err error) error {
		if conn.Conn().IsClosed() {
			return &lostBeforeCommit{err}
		}
		return err
	}
	tx, err := conn.BeginTx(ctx, opts)
	if err != nil {
		return lost(err)
	}
	readOnly := opts.AccessMode == pgx.ReadOnly
	var xid string // the transaction's id, to ask what became of it
	if !readOnly {
		if err := tx.QueryRow(ctx, "SELECT pg_current_xact_id()::text").Scan(&xid); err != nil {
			_ = tx.Rollback(ctx)
			return lost(err)
		}
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback(ctx) // nothing is left of it either way
		return lost(err)
	}
	err = tx.Commit(ctx)
	switch {
	case err == nil:
		return nil
	case readOnly || !conn.Conn().IsClosed():
		// Read only, or an answer from a live session (a COMMIT that
		// fails rolls back): the outcome is known. pgconn.SafeToRetry
		// cannot tell a COMMIT that was never sent: pgx reports a
		// connection cut while it waits for the COMMIT's answer as "conn
		// closed", safe to retry, although the COMMIT went out and may
		// have taken effect (TestCommitCutInFlight).
		return lost(err)
	}
	switch status := b.xactStatus(ctx, xid); status {
	case "committed":
		return nil
	case "aborted":
		return &lostBeforeCommit{err}
	default:
		return fmt.Errorf("the connection died during the COMMIT (%s): %w: %w", status, errCommitUnknown, err)
	}
}

// xactStatus asks the server what became of transaction xid, on a live
// connection: committed, aborted, or (while its session lingers) in
// progress, waited for up to outcomeWait. Anything else it returns is why
// it could not tell. A connection that fails it on the way (the cut that
// lost the COMMIT takes its siblings with it, and the pool finds out only
// when it uses them) is not an answer: it asks again on another.
func (b boundedPool) xactStatus(ctx context.Context, xid string) string {
	ctx, cancel := context.WithTimeout(ctx, outcomeWait)
	defer cancel()
	for {
		status, err := b.askXactStatus(ctx, xid)
		switch {
		case err == nil && status == nil:
			return "too old to tell"
		case err == nil && *status != "in progress":
			return *status
		}
		select {
		case <-ctx.Done():
			if err != nil {
				return "cannot ask: " + err.Error()
			}
			return "still in progress"
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// askXactStatus is one pg_xact_status of xid, on a connection that has
// just answered a ping.
func (b boundedPool) askXactStatus(ctx context.Context, xid string) (*string, error) {
	conn, err := b.acquire(ctx, true)
	if err != nil {
		return nil, err
	}
	defer conn.Release()
	var status *string
	err = conn.QueryRow(ctx, "SELECT pg_xact_status($1::xid8)", xid).Scan(&status)
	return status, err
}

// outcomeWait bounds the wait for the outcome of a COMMIT whose connection
// was cut: a fresh connection (after a failover, the pool has to make one)
// and the answer. A 503 that says "it may have taken effect" sends the
// client into the reading or retrying that a few seconds of patience
// spare it.
const outcomeWait = 5 * time.Second

// acquire takes a connection, waiting at most acquireTimeout (else an
// error that is errOverloaded). fresh: one that answers a ping, the dead
// ones it finds on the way destroyed.
func (b boundedPool) acquire(ctx context.Context, fresh bool) (*pgxpool.Conn, error) {
	acquireCtx, cancel := context.WithTimeout(ctx, b.acquireTimeout)
	defer cancel()
	for {
		conn, err := b.pool.Acquire(acquireCtx)
		if err != nil {
			if ctx.Err() == nil && errors.Is(acquireCtx.Err(), context.DeadlineExceeded) {
				return nil, fmt.Errorf("no database connection free within %s: %w", b.acquireTimeout, errOverloaded)
			}
			return nil, err
		}
		if !fresh {
			return conn, nil
		}
		err = conn.Ping(acquireCtx)
		if err == nil {
			return conn, nil
		}
		dead := conn.Conn().IsClosed()
		conn.Release()
		if !dead || acquireCtx.Err() != nil {
			return nil, err
		}
	}
}
