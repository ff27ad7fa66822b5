// Command outbox-relay publishes the committed rows of message_outbox to
// RabbitMQ: it claims due rows (FOR UPDATE SKIP LOCKED, with a lease),
// publishes them with publisher confirms and mandatory routing, and marks
// each row by the broker's answer. Run as many as you like side by side.
//
//	outbox-relay [-migrate]                 publish; admin endpoints on ADMIN_ADDR
//	outbox-relay migrate [up|down|status]   manage the schema and exit
//	outbox-relay healthcheck                exit 0 when its /readyz answers 200 (docker compose)
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"regexp"
	"time"

	"github.com/yourorg/orders/internal/app"
	"github.com/yourorg/orders/internal/config"
	"github.com/yourorg/orders/internal/consumer"
	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/domain"
	"github.com/yourorg/orders/internal/messaging"
	"github.com/yourorg/orders/internal/messaging/outbox"
	"github.com/yourorg/orders/internal/messaging/outbox/wal"
)

const service = "outbox-relay"

// Config is every setting of outbox-relay; see the README for the table.
type Config struct {
	config.Environment
	config.Database
	config.Log
	config.Telemetry
	config.Partitions
	// AMQPURL is the RabbitMQ broker: a URL, or the URLs of a cluster's
	// nodes separated by commas (messaging.URLs).
	AMQPURL string `env:"AMQP_URL" envDefault:"amqp://guest:guest@127.0.0.1:5672/" passwordFile:"AMQP_PASSWORD_FILE"`
	// AdminAddr serves /healthz, /readyz and /metrics.
	AdminAddr string `env:"ADMIN_ADDR" envDefault:":9101"`
	// Mode is how the relay finds the rows to publish: poll (claim them
	// from the table) or wal (stream them from the write-ahead log through
	// a logical replication slot). docs/outbox-relay.md compares the two.
	Mode string `env:"RELAY_MODE" envDefault:"poll"`
	// The wal mode's slot, heartbeat and sweep (wal.Config).
	WALSlot       string        `env:"RELAY_WAL_SLOT" envDefault:"orders_outbox_relay"`
	WALHeartbeat  time.Duration `env:"RELAY_WAL_HEARTBEAT" envDefault:"10s"`
	WALSweepAfter time.Duration `env:"RELAY_WAL_SWEEP_AFTER" envDefault:"30s"`
	// WALDatabaseURL is the wal mode's replication connection, as a role
	// with REPLICATION (orders_relay_wal); DATABASE_URL's role needs none.
	// Empty: DATABASE_URL.
	WALDatabaseURL string `env:"RELAY_WAL_DATABASE_URL" passwordFile:"RELAY_WAL_DATABASE_PASSWORD_FILE"`
	// ListenURL is the LISTEN connection's, past any connection pooler
	// (outbox.Config.ListenURL), as DATABASE_URL's role. Empty:
	// DATABASE_URL.
	ListenURL string `env:"RELAY_LISTEN_DATABASE_URL" passwordFile:"DATABASE_PASSWORD_FILE"`
	// ID names this relay in claimed_by; default host name and pid.
	ID              string        `env:"RELAY_ID"`
	BatchSize       int           `env:"RELAY_BATCH_SIZE" envDefault:"500"`
	MaxInFlight     int           `env:"RELAY_MAX_IN_FLIGHT" envDefault:"2000"`
	PollInterval    time.Duration `env:"RELAY_POLL_INTERVAL" envDefault:"1s"`
	Notify          bool          `env:"RELAY_NOTIFY" envDefault:"true"`
	Lease           time.Duration `env:"RELAY_LEASE" envDefault:"30s"`
	ConfirmTimeout  time.Duration `env:"RELAY_CONFIRM_TIMEOUT" envDefault:"10s"`
	DBTimeout       time.Duration `env:"RELAY_DB_TIMEOUT" envDefault:"10s"`
	MaxAttempts     int           `env:"RELAY_MAX_ATTEMPTS" envDefault:"10"`
	BackoffBase     time.Duration `env:"RELAY_BACKOFF_BASE" envDefault:"1s"`
	BackoffMax      time.Duration `env:"RELAY_BACKOFF_MAX" envDefault:"5m"`
	Retention       time.Duration `env:"RELAY_RETENTION" envDefault:"168h"`
	TimePartition   string        `env:"RELAY_TIME_PARTITION" envDefault:"week"`
	ShutdownTimeout time.Duration `env:"SHUTDOWN_TIMEOUT" envDefault:"15s"`
}

// ReadyzAddr is where the healthcheck sub-command finds /readyz: its admin endpoints.
func (c *Config) ReadyzAddr() string { return c.AdminAddr }

// Validate checks every setting and reports all the bad ones.
func (c *Config) Validate() error {
	return errors.Join(
		c.Database.Validate(),
		c.Log.Validate(),
		c.Telemetry.Validate(),
		config.Named("AMQP_URL", messaging.CheckURL(c.AMQPURL)),
		c.Partitions.Validate(),
		config.Positive("RELAY_BATCH_SIZE", c.BatchSize),
		config.Positive("RELAY_MAX_IN_FLIGHT", c.MaxInFlight),
		config.Positive("RELAY_POLL_INTERVAL", c.PollInterval),
		config.Positive("RELAY_LEASE", c.Lease),
		config.Positive("RELAY_CONFIRM_TIMEOUT", c.ConfirmTimeout),
		config.Positive("RELAY_DB_TIMEOUT", c.DBTimeout),
		config.Positive("RELAY_MAX_ATTEMPTS", c.MaxAttempts),
		config.Positive("RELAY_BACKOFF_BASE", c.BackoffBase),
		config.Positive("RELAY_BACKOFF_MAX", c.BackoffMax),
		config.Positive("SHUTDOWN_TIMEOUT", c.ShutdownTimeout),
		c.validateRelay(),
	)
}

// validateRelay checks the settings that must agree with each other,
// naming the variables. outbox.Config.Validate checks the same rules in
// its own words; it runs last, for any rule added there later.
func (c *Config) validateRelay() error {
	var errs []error
	if c.Lease <= c.ConfirmTimeout {
		errs = append(errs, fmt.Errorf("RELAY_LEASE (%s) must be longer than RELAY_CONFIRM_TIMEOUT (%s): a row's lease must outlast the wait for its confirm", c.Lease, c.ConfirmTimeout))
	}
	if c.MaxInFlight < c.BatchSize {
		errs = append(errs, fmt.Errorf("RELAY_MAX_IN_FLIGHT (%d) must be at least RELAY_BATCH_SIZE (%d): the confirm window must hold one batch", c.MaxInFlight, c.BatchSize))
	}
	if c.BackoffMax < c.BackoffBase {
		errs = append(errs, fmt.Errorf("RELAY_BACKOFF_MAX (%s) must not be below RELAY_BACKOFF_BASE (%s)", c.BackoffMax, c.BackoffBase))
	}
	if c.Retention < 0 {
		errs = append(errs, fmt.Errorf("RELAY_RETENTION must not be negative, got %s", c.Retention))
	}
	if c.TimePartition != outbox.Day && c.TimePartition != outbox.Week {
		errs = append(errs, fmt.Errorf("RELAY_TIME_PARTITION must be %s or %s, got %q", outbox.Day, outbox.Week, c.TimePartition))
	}
	if u, err := url.Parse(c.ListenURL); c.ListenURL != "" && (err != nil || u.Scheme != "postgres" && u.Scheme != "postgresql") {
		errs = append(errs, errors.New("RELAY_LISTEN_DATABASE_URL must be a postgres:// URL"))
	}
	switch c.Mode {
	case "poll":
	case "wal":
		if !slotName.MatchString(c.WALSlot) {
			errs = append(errs, fmt.Errorf("RELAY_WAL_SLOT %q: a slot name is 1 to 63 lower-case letters, digits and underscores", c.WALSlot))
		}
		if u, err := url.Parse(c.WALDatabaseURL); c.WALDatabaseURL != "" && (err != nil || u.Scheme != "postgres" && u.Scheme != "postgresql") {
			errs = append(errs, errors.New("RELAY_WAL_DATABASE_URL must be a postgres:// URL"))
		}
		if c.WALHeartbeat <= 0 || c.WALSweepAfter <= 0 {
			errs = append(errs, errors.New("RELAY_WAL_HEARTBEAT and RELAY_WAL_SWEEP_AFTER must be positive"))
		}
	default:
		errs = append(errs, fmt.Errorf("RELAY_MODE must be poll or wal, got %q", c.Mode))
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	rc := c.relayConfig()
	if err := rc.Validate(); err != nil {
		return fmt.Errorf("RELAY_*: %w", err)
	}
	return nil
}

func (c *Config) relayConfig() outbox.Config {
	return outbox.Config{
		ID: c.ID, BatchSize: c.BatchSize, MaxInFlight: c.MaxInFlight, PollInterval: c.PollInterval,
		NotifyOff: !c.Notify, ListenURL: c.ListenURL, Lease: c.Lease, ConfirmTimeout: c.ConfirmTimeout, MaxAttempts: c.MaxAttempts,
		BackoffBase: c.BackoffBase, BackoffMax: c.BackoffMax, ShutdownTimeout: c.ShutdownTimeout, DBTimeout: c.DBTimeout,
		Retention: c.Retention, TimePartition: c.TimePartition, MessageTypes: domain.MessageTypes(), Readers: consumer.Readers(c.MessagePartitions),
		Partitions: c.MessagePartitions,
	}
}

// slotName is what PostgreSQL accepts as a replication slot's name.
var slotName = regexp.MustCompile(`^[a-z0-9_]{1,63}$`)

// relay is what the process runs: the polling or the log-tailing relay.
type relay interface {
	Run(ctx context.Context) error
	Ready(ctx context.Context) error
}

// newRelay builds the relay of RELAY_MODE.
func (c *Config) newRelay(deps messaging.Deps) (relay, error) {
	if c.Mode == "wal" {
		return wal.NewRelay(c.relayConfig(), wal.Config{
			Slot: c.WALSlot, Heartbeat: c.WALHeartbeat, SweepAfter: c.WALSweepAfter, ReplicationURL: c.WALDatabaseURL,
		}, deps)
	}
	return outbox.NewRelay(c.relayConfig(), deps)
}

func main() { app.Main(service, run) }

// run is the whole process; environ replaces the process environment when
// not nil (tests).
func run(ctx context.Context, args []string, environ map[string]string, stdout, stderr io.Writer) error {
	var cfg Config
	return app.Start(ctx, service, &cfg, args, environ, stdout, stderr, nil, func(ctx context.Context, p *app.Process) error {
		// Database. The relay's own writes (claims, marks) commit
		// asynchronously: losing the last of them in a database crash only
		// means publishing a message again, which the consumers' inbox absorbs.
		pool, err := p.OpenDatabase(ctx, database.PoolConfig{AppName: service, AsyncCommit: true})
		if err != nil {
			return err
		}
		defer pool.Close()

		// The relay, and its admin endpoints beside it, until SIGINT/SIGTERM:
		// the relay then stops claiming, waits for the confirms of what it
		// published (SHUTDOWN_TIMEOUT) and hands back the rest.
		relay, err := cfg.newRelay(messaging.Deps{
			Pool: pool, AMQPURL: cfg.AMQPURL, Logger: p.Log, MeterProvider: p.Tel.MeterProvider, TracerProvider: p.Tel.TracerProvider,
		})
		if err != nil {
			return err
		}
		return p.RunWithAdmin(ctx, cfg.AdminAddr, app.AdminHandler(relay.Ready, p.Tel.MetricsHandler), relay.Run)
	})
}
