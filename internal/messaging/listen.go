package messaging

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
)

// NotifyChannel is the PostgreSQL channel the outbox trigger notifies when
// outbox rows commit (migrations/00002_message_outbox.sql).
const NotifyChannel = "message_outbox"

// listen wakes the claim loop whenever outbox rows commit. A notification
// is only a hint: it is lost while the connection is down, so after every
// (re)connect the relay sweeps once, and the poll tick covers the rest.
func (r *Relay) listen(ctx context.Context) {
	for failures := 0; ctx.Err() == nil; {
		err := r.listenOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		failures++
		delay := Backoff(failures, 200*time.Millisecond, 10*time.Second)
		r.log.WarnContext(ctx, "LISTEN connection lost; polling until it is back",
			slog.String("error", err.Error()), slog.Duration("retry_in", delay))
		sleep(ctx, delay)
	}
}

func (r *Relay) listenOnce(ctx context.Context) error {
	// A connection of its own: a LISTENing connection must not go back to
	// the pool for others to use.
	conn, err := pgx.ConnectConfig(ctx, r.pool.Config().ConnConfig.Copy())
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "LISTEN "+NotifyChannel); err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	r.signal() // notifications sent while we were not listening are gone: sweep
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			return fmt.Errorf("wait for notification: %w", err)
		}
		r.signal()
	}
}
