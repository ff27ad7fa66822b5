// Command order-consumer runs the consumers of the order service
// (internal/consumer: every one, or those CONSUMERS names), each on its own
// queue, behind the same delivery wrapper: inbox row, guarded
// transition, follow-up outbox rows and the inbox mark in one transaction,
// then the ack; delayed retries for transient failures, the parking lot for
// the rest.
//
//	order-consumer [-migrate]                        consume; admin endpoints on ADMIN_ADDR
//	order-consumer migrate [up|down|status|reset]    manage the schema and exit
//	order-consumer replay <consumer> [limit]         move parked messages back to the work queue
//	order-consumer healthcheck                       exit 0 when its /readyz answers 200 (docker compose)
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"time"

	"github.com/yourorg/orders/internal/app"
	"github.com/yourorg/orders/internal/config"
	"github.com/yourorg/orders/internal/consumer"
	"github.com/yourorg/orders/internal/consumer/notification"
	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/domain"
	"github.com/yourorg/orders/internal/messaging"
	"github.com/yourorg/orders/internal/messaging/inbox"
	"github.com/yourorg/orders/internal/messaging/inbox/inboxadmin"
)

const service = "order-consumer"

// Config is every setting of order-consumer; see the README for the table.
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
	AdminAddr string `env:"ADMIN_ADDR" envDefault:":9102"`
	// Consumers lists the consumers this process runs; empty runs every
	// consumer there is (internal/consumer.All).
	Consumers       []string        `env:"CONSUMERS" envSeparator:","`
	Prefetch        int             `env:"CONSUMER_PREFETCH" envDefault:"32"`
	Workers         int             `env:"CONSUMER_WORKERS" envDefault:"8"`
	BatchSize       int             `env:"CONSUMER_BATCH_SIZE" envDefault:"16"`
	BatchWait       time.Duration   `env:"CONSUMER_BATCH_WAIT" envDefault:"0s"`
	MaxAttempts     int             `env:"CONSUMER_MAX_ATTEMPTS" envDefault:"5"`
	RetryDelays     []time.Duration `env:"CONSUMER_RETRY_DELAYS" envDefault:"1s,5s,30s,2m" envSeparator:","`
	DeliveryLimit   int             `env:"CONSUMER_DELIVERY_LIMIT" envDefault:"20"`
	ProcessingLease time.Duration   `env:"CONSUMER_PROCESSING_LEASE" envDefault:"1m"`
	TxTimeout       time.Duration   `env:"CONSUMER_TX_TIMEOUT" envDefault:"30s"`
	InboxRetention  time.Duration   `env:"CONSUMER_INBOX_RETENTION" envDefault:"720h"`
	ReplayWindow    time.Duration   `env:"CONSUMER_REPLAY_WINDOW" envDefault:"168h"`
	TimePartition   string          `env:"CONSUMER_INBOX_TIME_PARTITION" envDefault:"week"`
	WebhookURL      string          `env:"NOTIFY_WEBHOOK_URL" secret:"url"`
	WebhookTimeout  time.Duration   `env:"NOTIFY_WEBHOOK_TIMEOUT" envDefault:"5s"`
	// FaultsEndpoint serves POST /faults/crash-after-commit on the admin
	// address, for the walkthrough and drills. Never in production.
	FaultsEndpoint  bool          `env:"CONSUMER_FAULTS_ENDPOINT" envDefault:"false"`
	ShutdownTimeout time.Duration `env:"SHUTDOWN_TIMEOUT" envDefault:"15s"`
	// FulfillmentDelay is how long fulfillment waits, outside any
	// transaction, before it requests the fulfillment of a submitted order:
	// a demo knob that leaves time to cancel by hand. 0 in production.
	FulfillmentDelay time.Duration `env:"FULFILLMENT_DELAY" envDefault:"0s"`
	// OrderFulfilledVersion is the version of order.fulfilled fulfillment
	// writes: 1 until every process that reads order.fulfilled reads
	// version 2 too, then 2 (docs/extending.md, "Evolve a message").
	OrderFulfilledVersion int `env:"ORDER_FULFILLED_VERSION" envDefault:"1"`
}

// ReadyzAddr is where the healthcheck sub-command finds /readyz: its admin endpoints.
func (c *Config) ReadyzAddr() string { return c.AdminAddr }

// Validate checks every setting and reports all the bad ones.
func (c *Config) Validate() error {
	errs := []error{
		c.Database.Validate(),
		c.Log.Validate(),
		c.Telemetry.Validate(),
		config.Named("AMQP_URL", messaging.CheckURL(c.AMQPURL)),
		c.Partitions.Validate(),
		config.Positive("CONSUMER_PREFETCH", c.Prefetch),
		config.Positive("CONSUMER_WORKERS", c.Workers),
		config.Positive("CONSUMER_BATCH_SIZE", c.BatchSize),
		config.Positive("CONSUMER_MAX_ATTEMPTS", c.MaxAttempts),
		config.Positive("CONSUMER_DELIVERY_LIMIT", c.DeliveryLimit),
		config.Positive("CONSUMER_PROCESSING_LEASE", c.ProcessingLease),
		config.Positive("CONSUMER_TX_TIMEOUT", c.TxTimeout),
		config.Positive("NOTIFY_WEBHOOK_TIMEOUT", c.WebhookTimeout),
		config.Positive("SHUTDOWN_TIMEOUT", c.ShutdownTimeout),
	}
	for _, name := range c.Consumers {
		if !slices.Contains(consumer.Names(), name) {
			errs = append(errs, fmt.Errorf("CONSUMERS: unknown consumer %q (want some of %v)", name, consumer.Names()))
		}
	}
	if versions := domain.MessageVersions(domain.TypeOrderFulfilled); !slices.Contains(versions, c.OrderFulfilledVersion) {
		errs = append(errs, fmt.Errorf("ORDER_FULFILLED_VERSION: order.fulfilled has no version %d (want one of %v)", c.OrderFulfilledVersion, versions))
	}
	if c.FulfillmentDelay < 0 {
		errs = append(errs, fmt.Errorf("FULFILLMENT_DELAY must not be negative, got %v", c.FulfillmentDelay))
	}
	if c.ProcessingLease <= c.WebhookTimeout {
		errs = append(errs, fmt.Errorf("CONSUMER_PROCESSING_LEASE (%s) must be longer than NOTIFY_WEBHOOK_TIMEOUT (%s)", c.ProcessingLease, c.WebhookTimeout))
	}
	for _, d := range c.RetryDelays {
		if d < time.Millisecond {
			errs = append(errs, fmt.Errorf("CONSUMER_RETRY_DELAYS: %s is shorter than a millisecond", d))
		}
	}
	if !slices.IsSorted(c.RetryDelays) {
		errs = append(errs, fmt.Errorf("CONSUMER_RETRY_DELAYS (%v): the retry delays must grow", c.RetryDelays))
	}
	if c.InboxRetention < 0 {
		errs = append(errs, fmt.Errorf("CONSUMER_INBOX_RETENTION must not be negative, got %s", c.InboxRetention))
	}
	if c.InboxRetention > 0 && c.InboxRetention < c.ReplayWindow {
		errs = append(errs, fmt.Errorf("CONSUMER_INBOX_RETENTION (%s) is shorter than CONSUMER_REPLAY_WINDOW (%s): a message that comes again "+
			"after its inbox row is dropped would be applied again; keep the rows longer, or shorten the window", c.InboxRetention, c.ReplayWindow))
	}
	if c.TimePartition != "day" && c.TimePartition != "week" {
		errs = append(errs, fmt.Errorf("CONSUMER_INBOX_TIME_PARTITION must be day or week, got %q", c.TimePartition))
	}
	if c.BatchWait < 0 {
		errs = append(errs, fmt.Errorf("CONSUMER_BATCH_WAIT must not be negative, got %s", c.BatchWait))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	// What the consumers themselves check, named above; anything else is
	// still reported.
	cc := c.consumerConfig()
	if err := cc.Validate(); err != nil {
		return fmt.Errorf("CONSUMER_*: %w", err)
	}
	return nil
}

func (c *Config) consumerConfig() inbox.Config {
	return consumer.Inbox(inbox.Config{
		Prefetch: c.Prefetch, Workers: c.Workers, BatchSize: c.BatchSize, BatchWait: c.BatchWait, MaxAttempts: c.MaxAttempts, RetryDelays: c.RetryDelays,
		DeliveryLimit: c.DeliveryLimit, ProcessingLease: c.ProcessingLease, ShutdownTimeout: c.ShutdownTimeout, TxTimeout: c.TxTimeout,
		InboxRetention: c.InboxRetention, ReplayWindow: c.ReplayWindow, TimePartition: c.TimePartition, Partitions: c.MessagePartitions,
	})
}

func main() { app.Main(service, run) }

// run is the whole process; environ replaces the process environment when
// not nil (tests).
func run(ctx context.Context, args []string, environ map[string]string, stdout, stderr io.Writer) error {
	var cfg Config
	commands := []string{
		"replay <consumer> [limit]    move parked messages back to the work queue",
		"declare                      declare every consumer's queues and bindings, and exit",
	}
	return app.Start(ctx, service, &cfg, args, environ, stdout, stderr, commands, func(ctx context.Context, p *app.Process) error {
		if len(p.Args.Command) > 0 {
			switch p.Args.Command[0] {
			case "declare":
				return inbox.Declare(ctx, cfg.AMQPURL, cfg.consumerConfig(), consumer.All(consumer.Deps{})...)
			default: // replay
				return replay(ctx, cfg, p.Args.Command[1:], p.Log)
			}
		}

		// Database.
		pool, err := p.OpenDatabase(ctx, database.PoolConfig{AppName: service})
		if err != nil {
			return err
		}
		defer pool.Close()

		// The consumers, and the walkthrough's fault when asked for.
		selected, err := consumer.Select(consumer.All(consumer.Deps{
			MeterProvider:         p.Tel.MeterProvider,
			Notifier:              notification.Config{URL: cfg.WebhookURL, Timeout: cfg.WebhookTimeout, TracerProvider: p.Tel.TracerProvider},
			FulfillmentDelay:      cfg.FulfillmentDelay,
			OrderFulfilledVersion: cfg.OrderFulfilledVersion,
		}), cfg.Consumers)
		if err != nil {
			return err
		}
		inboxCfg := cfg.consumerConfig()
		// Every consumer's queues exist whichever of them this process runs:
		// a message published while another consumer's process is down
		// still reaches its queue.
		inboxCfg.AlsoDeclare = others(consumer.All(consumer.Deps{}), selected)
		var crash *crashAfterCommit
		if cfg.FaultsEndpoint {
			crash = &crashAfterCommit{log: p.Log, exit: os.Exit}
			inboxCfg.Faults = crash
		}
		consumers, err := inbox.NewConsumers(inboxCfg, messaging.Deps{
			Pool: pool, AMQPURL: cfg.AMQPURL, Logger: p.Log, MeterProvider: p.Tel.MeterProvider, TracerProvider: p.Tel.TracerProvider,
		}, selected...)
		if err != nil {
			return err
		}
		admin := app.AdminHandler(consumers.Ready, p.Tel.MetricsHandler)
		if crash != nil {
			p.Log.WarnContext(ctx, "fault injection endpoint enabled: POST /faults/crash-after-commit")
			admin.Handle("POST /faults/crash-after-commit", crash)
		}

		// Consume until SIGINT/SIGTERM: then stop taking deliveries, finish
		// the ones in progress (SHUTDOWN_TIMEOUT) and leave the rest for
		// redelivery.
		return p.RunWithAdmin(ctx, cfg.AdminAddr, admin, consumers.Run)
	})
}

// others returns the consumers of all that selected does not hold.
func others(all, selected []*inbox.Consumer) []*inbox.Consumer {
	var out []*inbox.Consumer
	for _, c := range all {
		if !slices.ContainsFunc(selected, func(s *inbox.Consumer) bool { return s.Name() == c.Name() }) {
			out = append(out, c)
		}
	}
	return out
}

// replay is the replay sub-command: replay <consumer> [limit].
func replay(ctx context.Context, cfg Config, args []string, log *slog.Logger) error {
	if len(args) == 0 || !slices.Contains(consumer.Names(), args[0]) {
		return fmt.Errorf("replay: name a consumer, one of %v", consumer.Names())
	}
	limit := 1000
	if len(args) > 1 {
		n, err := strconv.Atoi(args[1])
		if err != nil || n < 1 {
			return fmt.Errorf("replay: limit %q is not a positive number", args[1])
		}
		limit = n
	}
	moved, err := inboxadmin.Replay(ctx, cfg.AMQPURL, args[0], inboxadmin.ReplayRequest{Limit: limit})
	log.InfoContext(ctx, "replayed parked messages", slog.String("consumer_name", args[0]),
		slog.String("from", inbox.ParkingLotName(inbox.QueueName(args[0]))), slog.Int("moved", len(moved)))
	return err
}
