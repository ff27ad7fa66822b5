package httpapi

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/yourorg/orders/internal/database"
)

// execBatch holds statements of a transaction whose results nothing reads
// before the COMMIT (the order's outbox row, its stored response) and
// sends them together, one round trip instead of one each. Each is queued
// through a database.DBTX of its own (queue) whose Exec only queues; send
// runs them in order, and the first one's failure comes back wrapped as
// the function that queued it wraps its errors, so that it rolls the
// transaction back and maps to the same HTTP error as when it ran alone.
type execBatch struct {
	batch pgx.Batch
	wraps []func(error) error
}

// queue returns a DBTX whose Exec queues its statement in b, its error to
// be wrapped by wrap. Its Query and QueryRow fail: a statement whose rows
// are read must not be queued.
func (b *execBatch) queue(wrap func(error) error) database.DBTX {
	return queuedExec{b: b, wrap: wrap}
}

// send runs the queued statements in tx, in one round trip.
func (b *execBatch) send(ctx context.Context, tx pgx.Tx) error {
	if len(b.wraps) == 0 {
		return nil
	}
	results := tx.SendBatch(ctx, &b.batch)
	var first error
	for _, wrap := range b.wraps {
		if _, err := results.Exec(); err != nil {
			first = wrap(err)
			break // those after it did not run
		}
	}
	if err := results.Close(); first == nil {
		first = err
	}
	return first
}

var errQueuedRows = errors.New("execBatch: a queued statement's rows cannot be read before the batch is sent")

type queuedExec struct {
	b    *execBatch
	wrap func(error) error
}

func (q queuedExec) Exec(_ context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	q.b.batch.Queue(sql, args...)
	q.b.wraps = append(q.b.wraps, q.wrap)
	return pgconn.CommandTag{}, nil
}

func (q queuedExec) Query(context.Context, string, ...any) (pgx.Rows, error) {
	return nil, errQueuedRows
}

func (q queuedExec) QueryRow(context.Context, string, ...any) pgx.Row {
	return errRow{}
}

type errRow struct{}

func (errRow) Scan(...any) error { return errQueuedRows }
