// Command order-api is the HTTP API of the order service: it accepts orders
// and cancellations, and writes each change together with its outbox
// message in one transaction. The outbox-relay publishes those messages.
// It also serves the order timeline pages under /ui/.
//
//	order-api [-migrate]                 serve on HTTP_ADDR
//	order-api migrate [up|down|status]   manage the schema and exit
//	order-api healthcheck                exit 0 when its /readyz answers 200 (docker compose)
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/yourorg/orders/internal/app"
	"github.com/yourorg/orders/internal/background"
	"github.com/yourorg/orders/internal/config"
	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/httpapi"
	"github.com/yourorg/orders/internal/store"
)

const service = "order-api"

// Config is every setting of order-api; see the README for the table.
type Config struct {
	config.Environment
	config.Database
	config.Log
	config.Telemetry
	config.Auth
	// HTTPAddr is where the API (and its /metrics) listens.
	HTTPAddr string `env:"HTTP_ADDR" envDefault:":8080"`
	// IdempotencyKeyTTL is how long an Idempotency-Key is remembered.
	IdempotencyKeyTTL time.Duration `env:"IDEMPOTENCY_KEY_TTL" envDefault:"24h"`
	// AcquireTimeout bounds a request's wait for a database connection;
	// past it the request is a 503 with Retry-After.
	AcquireTimeout time.Duration `env:"DB_ACQUIRE_TIMEOUT" envDefault:"1s"`
	// MaxInFlight caps the requests handled at once; one more is a 503 with
	// Retry-After (the probes and /metrics are not counted).
	MaxInFlight int `env:"HTTP_MAX_IN_FLIGHT" envDefault:"100"`
	// ShutdownDelay is how long the API keeps serving after SIGTERM with
	// /readyz answering 503, so that load balancers stop sending requests
	// before it stops accepting them.
	ShutdownDelay time.Duration `env:"SHUTDOWN_DELAY" envDefault:"0s"`
	// ShutdownTimeout bounds the wait for requests in flight on SIGTERM.
	ShutdownTimeout time.Duration `env:"SHUTDOWN_TIMEOUT" envDefault:"15s"`
	// JaegerUIURL is the Jaeger UI the order timeline page (/ui/) links
	// each order's trace to; empty: no link, the trace id only.
	JaegerUIURL string `env:"JAEGER_UI_URL"`
	// PublicURL is where clients reach the API, when a proxy or load
	// balancer in front of it ends TLS (https://orders.example.com): with
	// https, the /ui/ sign-in cookie is Secure although requests arrive
	// over plain HTTP. Empty: the cookie is Secure only when TLS ends here.
	PublicURL string `env:"API_PUBLIC_URL"`
}

// ReadyzAddr is where the healthcheck sub-command finds /readyz: the API serves /readyz beside its routes.
func (c *Config) ReadyzAddr() string { return c.HTTPAddr }

// Validate checks every setting and reports all the bad ones, except the
// Auth block: `order-api migrate` needs no keys, so run checks it before
// it serves.
func (c *Config) Validate() error {
	var delay, jaeger, public error
	if c.ShutdownDelay < 0 {
		delay = fmt.Errorf("SHUTDOWN_DELAY must not be negative, got %v", c.ShutdownDelay)
	}
	if c.JaegerUIURL != "" {
		if u, err := url.Parse(c.JaegerUIURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			jaeger = fmt.Errorf("JAEGER_UI_URL must be an http(s) URL such as http://localhost:16686, got %q", c.JaegerUIURL)
		}
	}
	if c.PublicURL != "" {
		if u, err := url.Parse(c.PublicURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			public = fmt.Errorf("API_PUBLIC_URL must be an http(s) URL such as https://orders.example.com, got %q", c.PublicURL)
		}
	}
	return errors.Join(
		c.Database.Validate(),
		c.Log.Validate(),
		c.Telemetry.Validate(),
		config.Positive("IDEMPOTENCY_KEY_TTL", c.IdempotencyKeyTTL),
		config.Positive("DB_ACQUIRE_TIMEOUT", c.AcquireTimeout),
		config.Positive("HTTP_MAX_IN_FLIGHT", c.MaxInFlight),
		delay,
		config.Positive("SHUTDOWN_TIMEOUT", c.ShutdownTimeout),
		jaeger,
		public,
	)
}

// reachedOverHTTPS tells whether clients reach the API over HTTPS
// (API_PUBLIC_URL), whatever scheme its requests arrive with.
func (c *Config) reachedOverHTTPS() bool {
	u, err := url.Parse(c.PublicURL)
	return err == nil && u.Scheme == "https"
}

func main() { app.Main(service, run) }

// run is the whole process; environ replaces the process environment when
// not nil (tests).
func run(ctx context.Context, args []string, environ map[string]string, stdout, stderr io.Writer) error {
	var cfg Config
	return app.Start(ctx, service, &cfg, args, environ, stdout, stderr, nil, func(ctx context.Context, p *app.Process) error {
		log := p.Log
		// Authentication: checked here, not in Validate, so that
		// `order-api migrate` needs no keys.
		if err := cfg.Auth.Validate(); err != nil {
			return fmt.Errorf("configuration: %w", err)
		}
		verifier, err := cfg.Verifier()
		if err != nil {
			return fmt.Errorf("configuration: %w", err)
		}
		if verifier.IsOff() {
			log.WarnContext(ctx, "API_AUTH=off: authentication is off, every request is treated as an operator's; "+
				"for local experiments only, never where anyone else can reach the API")
		}

		// Database.
		pool, err := p.OpenDatabase(ctx, database.PoolConfig{AppName: service})
		if err != nil {
			return err
		}
		defer pool.Close()

		// Background: forget expired idempotency keys.
		go idempotencyKeyRetention(pool, cfg.IdempotencyKeyTTL, log).Run(ctx)

		// Serve until SIGINT/SIGTERM. Then /readyz answers 503 at once (ctx
		// is done), the API goes on serving for SHUTDOWN_DELAY, and then it
		// stops accepting connections and drains the requests in flight.
		handler, err := httpapi.New(httpapi.Config{
			IdempotencyKeyTTL: cfg.IdempotencyKeyTTL,
			AcquireTimeout:    cfg.AcquireTimeout,
			MaxInFlight:       cfg.MaxInFlight,
			JaegerUIURL:       cfg.JaegerUIURL,
			SecureCookie:      cfg.reachedOverHTTPS(),
		}, httpapi.Deps{
			Verifier:       verifier,
			Pool:           pool,
			Logger:         log,
			TracerProvider: p.Tel.TracerProvider,
			MeterProvider:  p.Tel.MeterProvider,
			MetricsHandler: p.Tel.MetricsHandler,
			ShuttingDown:   ctx.Done(),
		})
		if err != nil {
			return err
		}
		serveCtx, stopServing := context.WithCancel(context.WithoutCancel(ctx))
		defer stopServing()
		go func() {
			select {
			case <-ctx.Done():
			case <-serveCtx.Done(): // Serve failed
				return
			}
			log.InfoContext(serveCtx, "shutting down: not ready; serving for SHUTDOWN_DELAY, then draining",
				slog.Duration("shutdown_delay", cfg.ShutdownDelay))
			select {
			case <-time.After(cfg.ShutdownDelay):
			case <-serveCtx.Done():
			}
			stopServing()
		}()
		return app.Serve(serveCtx, app.NewHTTPServer(cfg.HTTPAddr, handler, log), cfg.ShutdownTimeout, log, nil)
	})
}

// idempotencyKeyRetention deletes expired keys every minute, a batch at a
// time so that no statement runs long.
func idempotencyKeyRetention(pool *pgxpool.Pool, ttl time.Duration, log *slog.Logger) background.Retention {
	return background.Retention{
		What: "expired idempotency keys", Logger: log,
		Delete: func(ctx context.Context, limit int) (int64, error) {
			return store.DeleteExpiredIdempotencyKeys(ctx, pool, ttl, limit)
		},
	}
}
