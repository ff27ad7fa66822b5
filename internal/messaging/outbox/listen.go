package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/yourorg/orders/internal/background"
)

// NotifyChannel is the PostgreSQL channel the outbox trigger notifies when
// outbox rows commit (migrations/00001_message_outbox.sql).
const NotifyChannel = "message_outbox"

// listen wakes the claim loop whenever outbox rows commit. A notification
// is only a hint: it is lost while the connection is down, so after every
// (re)connect the relay sweeps once, and the poll tick covers the rest.
func (r *Relay) listen(ctx context.Context) {
	background.Reconnect{
		What: "LISTEN connection (polling until it is back)", Base: 200 * time.Millisecond, MaxDelay: 10 * time.Second,
		Logger: r.log, Session: r.listenOnce,
	}.Run(ctx)
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
