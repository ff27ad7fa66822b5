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
//	order-consumer catalog                           print docs/catalog.md: the message types, the consumers, their queues
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/yourorg/orders/internal/app"
	"github.com/yourorg/orders/internal/config"
	"github.com/yourorg/orders/internal/consumer"
	"github.com/yourorg/orders/internal/consumer/notification"
	"github.com/yourorg/orders/internal/domain"
	"github.com/yourorg/orders/internal/messaging/inbox"
	"github.com/yourorg/orders/internal/store"
	"github.com/yourorg/orders/internal/telemetry"
)

const service = "order-consumer"

// Config is every setting of order-consumer; see the README for the table.
type Config struct {
	config.Environment
	config.Database
	config.Log
	config.Telemetry
	// AMQPURL is the RabbitMQ broker.
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
}

// Validate checks every setting and reports all the bad ones.
func (c *Config) Validate() error {
	errs := []error{
		c.Database.Validate(),
		c.Log.Validate(),
		c.Telemetry.Validate(),
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
	return inbox.Config{
		Prefetch: c.Prefetch, Workers: c.Workers, BatchSize: c.BatchSize, BatchWait: c.BatchWait, MaxAttempts: c.MaxAttempts, RetryDelays: c.RetryDelays,
		DeliveryLimit: c.DeliveryLimit, ProcessingLease: c.ProcessingLease, ShutdownTimeout: c.ShutdownTimeout, TxTimeout: c.TxTimeout,
		InboxRetention: c.InboxRetention, Producer: service,
	}
}

func main() { app.Main(service, run) }

// run is the whole process; environ replaces the process environment when
// not nil (tests).
func run(ctx context.Context, args []string, environ map[string]string, stdout, stderr io.Writer) error {
	// Configuration and command line.
	var cfg Config
	if err := config.Load(&cfg, environ); err != nil {
		return err
	}
	cli, err := app.ParseArgs(service, args, stderr,
		"replay <consumer> [limit]    move parked messages back to the work queue",
		"catalog                      print the message types, the consumers and their queues (docs/catalog.md)")
	if err != nil {
		return err
	}

	if len(cli.Command) > 0 && cli.Command[0] == "catalog" {
		return consumer.WriteCatalog(stdout, consumer.All(consumer.Deps{}))
	}

	// Telemetry: logs, traces and metrics.
	tel, err := telemetry.Setup(ctx, service, cfg.Telemetry, cfg.Log, stdout)
	if err != nil {
		return fmt.Errorf("telemetry: %w", err)
	}
	defer func() { _ = tel.Shutdown(context.WithoutCancel(ctx)) }()
	log := tel.Logger
	if len(cli.Command) > 0 {
		switch cli.Command[0] {
		case "migrate":
			return app.RunMigrate(ctx, cfg.Database, cli.Command[1:], log, stdout)
		case "replay":
			return replay(ctx, cfg, cli.Command[1:], log)
		}
	}
	log.InfoContext(ctx, "starting", config.LogAttrs(&cfg)...)
	config.WarnDevelopment(ctx, log, &cfg)

	// Database.
	pool, err := app.OpenDatabase(ctx, store.PoolConfig{AppName: service}, cfg.Database, cli.Migrate, tel)
	if err != nil {
		return err
	}
	defer pool.Close()

	// The consumers, and their admin endpoints beside them.
	selected, err := consumer.Select(consumer.All(consumer.Deps{
		MeterProvider:    tel.MeterProvider,
		Notifier:         notification.Config{URL: cfg.WebhookURL, Timeout: cfg.WebhookTimeout, TracerProvider: tel.TracerProvider},
		FulfillmentDelay: cfg.FulfillmentDelay,
	}), cfg.Consumers)
	if err != nil {
		return err
	}
	consumers, err := inbox.NewConsumers(cfg.consumerConfig(), inbox.Deps{
		Pool: pool, AMQPURL: cfg.AMQPURL, Logger: log, MeterProvider: tel.MeterProvider, TracerProvider: tel.TracerProvider,
	}, selected...)
	if err != nil {
		return err
	}
	adminMux := app.AdminHandler(consumers.Ready, tel.MetricsHandler)
	if cfg.FaultsEndpoint {
		log.WarnContext(ctx, "fault injection endpoint enabled: POST /faults/crash-after-commit")
		adminMux.HandleFunc("POST /faults/crash-after-commit", crashAfterCommit(consumers, log))
	}
	admin := app.NewHTTPServer(cfg.AdminAddr, adminMux, log)

	// Consume until SIGINT/SIGTERM: then stop taking deliveries, finish the
	// ones in progress (SHUTDOWN_TIMEOUT) and leave the rest for redelivery.
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return consumers.Run(gctx) })
	g.Go(func() error { return app.Serve(gctx, admin, 5*time.Second, log, nil) })
	err = g.Wait()
	log.InfoContext(ctx, "stopped", slog.Any("error", err))
	return err
}

// crashAfterCommit arms the one-shot crash of the next delivery of a
// message type, between its commit and its ack: POST {"message_type": "..."}.
func crashAfterCommit(consumers *inbox.Consumers, log *slog.Logger) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			MessageType string `json:"message_type"`
		}
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4096)).Decode(&body); err != nil || !domain.KnownMessageType(body.MessageType) {
			http.Error(w, `want {"message_type": "<a message type of this service>"}`, http.StatusBadRequest)
			return
		}
		consumers.CrashAfterCommit(body.MessageType)
		log.WarnContext(r.Context(), "fault armed: the next delivery of this type exits after its commit, before its ack",
			slog.String("message_type", body.MessageType))
		w.WriteHeader(http.StatusAccepted)
	}
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
	moved, err := inbox.Replay(ctx, cfg.AMQPURL, args[0], inbox.ReplayRequest{Limit: limit})
	log.InfoContext(ctx, "replayed parked messages", slog.String("consumer_name", args[0]),
		slog.String("from", inbox.ParkingLotName(inbox.QueueName(args[0]))), slog.Int("moved", len(moved)))
	return err
}
