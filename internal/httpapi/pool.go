package httpapi

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/yourorg/orders/internal/database"
)

// errOverloaded is a request turned away because the server is at its
// limit (every database connection busy, or too many requests in flight):
// a 503 with Retry-After, so that the client backs off instead of the
// server piling up goroutines that wait.
var errOverloaded = errors.New("overloaded")

// The handlers' transactions (database.Run). One whose connection died (a
// failover, a restart of a connection pooler, pg_terminate_backend, a
// network cut) is run again, up to database.MaxReruns times, when it is
// certain that it wrote nothing, so the client sees a slower answer instead of a 503; a COMMIT
// cut off in flight is asked after by the transaction's id: committed, the
// handler answers as if the COMMIT had; still unknown after 5 s, the
// request is 503 commit_outcome_unknown, and a retry with the same
// Idempotency-Key finds the order if the COMMIT took effect. Never is it
// run again blindly: that could create a second order. A handler's
// function may run twice: it sets what it reads after afresh on each run.
var (
	writeTx = database.Policy{ConfirmCommit: true}
	readTx  = database.Policy{Options: pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, ConfirmCommit: true}
)

// boundedPool is the pool the handlers' transactions run on, waiting at
// most acquireTimeout for a connection. pgxpool waits as long as the
// request's context lets it; under overload that is a goroutine, a request
// and a client waiting per request, all of them late.
type boundedPool struct {
	pool           *pgxpool.Pool
	acquireTimeout time.Duration
}

// Acquire takes a connection, waiting at most acquireTimeout (else an
// error that is errOverloaded).
func (b boundedPool) Acquire(ctx context.Context) (*pgxpool.Conn, error) {
	acquireCtx, cancel := context.WithTimeout(ctx, b.acquireTimeout)
	defer cancel()
	conn, err := b.pool.Acquire(acquireCtx)
	if err != nil && ctx.Err() == nil && errors.Is(acquireCtx.Err(), context.DeadlineExceeded) {
		return nil, fmt.Errorf("no database connection free within %s: %w", b.acquireTimeout, errOverloaded)
	}
	return conn, err
}
