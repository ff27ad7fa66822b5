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

// boundedPool begins the handlers' transactions on the pool, waiting at
// most acquireTimeout for a connection. pgxpool waits as long as the
// request's context lets it; under overload that is a goroutine, a request
// and a client waiting per request, all of them late.
type boundedPool struct {
	pool           *pgxpool.Pool
	acquireTimeout time.Duration
}

// Begin begins a transaction, as pgx.BeginFunc needs.
func (b boundedPool) Begin(ctx context.Context) (pgx.Tx, error) {
	return b.BeginTx(ctx, pgx.TxOptions{})
}

// BeginTx takes a connection, waiting at most acquireTimeout (else an
// error that is errOverloaded), and begins a transaction on it. The
// connection goes back to the pool when the transaction ends.
func (b boundedPool) BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error) {
	acquireCtx, cancel := context.WithTimeout(ctx, b.acquireTimeout)
	defer cancel()
	conn, err := b.pool.Acquire(acquireCtx)
	if err != nil {
		if ctx.Err() == nil && errors.Is(acquireCtx.Err(), context.DeadlineExceeded) {
			return nil, fmt.Errorf("no database connection free within %s: %w", b.acquireTimeout, errOverloaded)
		}
		return nil, err
	}
	tx, err := conn.BeginTx(ctx, opts)
	if err != nil {
		conn.Release()
		return nil, err
	}
	return &releasingTx{Tx: tx, conn: conn}, nil
}

// releasingTx releases its connection when it commits or rolls back, as
// the transactions of pgxpool.Pool.Begin do.
type releasingTx struct {
	pgx.Tx
	conn *pgxpool.Conn
}

func (t *releasingTx) Commit(ctx context.Context) error {
	err := t.Tx.Commit(ctx)
	t.release()
	return err
}

func (t *releasingTx) Rollback(ctx context.Context) error {
	err := t.Tx.Rollback(ctx)
	t.release()
	return err
}

func (t *releasingTx) release() {
	if t.conn != nil {
		t.conn.Release()
		t.conn = nil
	}
}
