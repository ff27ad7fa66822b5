package database

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/yourorg/orders/internal/background"
)

// OutageRetryMax is the longest a background loop waits between tries
// while the database is unavailable (RetryDelay). A failover ends at a
// moment no count of failures predicts: a wait that doubled through a
// ten-second promotion slept on for seconds after the new primary took
// writes. A try a second costs a refused connection at most.
const OutageRetryMax = time.Second

// RetryDelay is how long a loop that calls the database waits after the
// failures-th failure in a row, err the last: while the database is
// unavailable (IsUnavailable: down, failing over, a standby refusing
// writes), from 200 ms growing to OutageRetryMax, so that the loop works
// again within about a second of the database answering; after any other
// error, from 200 ms growing to maxDelay, so that a fault that waiting
// does not mend is not hammered.
func RetryDelay(failures int, err error, maxDelay time.Duration) time.Duration {
	if IsUnavailable(err) {
		maxDelay = min(maxDelay, OutageRetryMax)
	}
	return background.Backoff(failures, 200*time.Millisecond, maxDelay)
}

// Ping is a process's readiness check of its database (each binary's
// /readyz): nil when the pool reaches a server that takes writes, else an
// error that says in plain words what is going on, "database failing over"
// while no server of the URL takes writes (the one that answers is a
// standby: target_session_attrs=read-write refused it, or it refused a
// write) or none answers.
func Ping(ctx context.Context, pool *pgxpool.Pool) error {
	err := pool.Ping(ctx)
	switch {
	case err == nil:
		return nil
	case readOnly(err):
		return fmt.Errorf("database failing over: no server takes writes yet: %w", err)
	case IsUnavailable(err):
		return fmt.Errorf("database failing over or down: %w", err)
	}
	return fmt.Errorf("database: %w", err)
}

// readOnly reports whether err says the server reached is read-only: a
// standby that a read-write connection refused, or a write it refused.
func readOnly(err error) bool {
	var pgErr *pgconn.PgError
	return errors.Is(err, pgconn.ErrReadOnlyConnection) || errors.As(err, &pgErr) && pgErr.Code == "25006"
}
