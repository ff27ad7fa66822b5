package outbox

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/yourorg/orders/internal/background"
	"github.com/yourorg/orders/internal/database"
)

// notifyChannel is the PostgreSQL channel the outbox trigger notifies when
// outbox rows commit (migrations/00001_message_outbox.sql).
const notifyChannel = "message_outbox"

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
	cfg, err := r.listenConfig()
	if err != nil {
		return err
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	// The pool's URL may lead through a pooler; one given for the LISTEN
	// connection is trusted (a pooler in session mode passes NOTIFYs on).
	if pooled, err := r.throughPooler(ctx, conn); err != nil {
		return err
	} else if pooled {
		_ = conn.Close(ctx)
		r.log.WarnContext(ctx, "the LISTEN connection leads through a connection pooler, where a LISTEN hears nothing in transaction mode: "+
			"the relay only polls (RELAY_POLL_INTERVAL); RELAY_LISTEN_DATABASE_URL, past the pooler or through one in session mode, wakes it at once",
			slog.Duration("poll_interval", r.cfg.PollInterval))
		<-ctx.Done()
		return ctx.Err()
	}
	if _, err := conn.Exec(ctx, "LISTEN "+notifyChannel); err != nil {
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

// listenConfig is the LISTEN connection's settings: Config.ListenURL's,
// named and traced as the pool's connections, or the pool's own.
func (r *Relay) listenConfig() (*pgx.ConnConfig, error) {
	pooled := r.pool.Config().ConnConfig
	if r.cfg.ListenURL == "" {
		return pooled.Copy(), nil
	}
	cfg, err := pgx.ParseConfig(r.cfg.ListenURL)
	if err != nil {
		return nil, fmt.Errorf("the LISTEN connection's URL: %w", err)
	}
	cfg.RuntimeParams["application_name"] = pooled.RuntimeParams["application_name"]
	cfg.Tracer = pooled.Tracer
	return cfg, nil
}

// throughPooler reports whether the LISTEN connection, on the pool's URL,
// leads through a connection pooler (database.ThroughPooler).
func (r *Relay) throughPooler(ctx context.Context, conn *pgx.Conn) (bool, error) {
	if r.cfg.ListenURL != "" {
		return false, nil
	}
	return database.ThroughPooler(ctx, conn)
}
