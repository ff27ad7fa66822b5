// Command walkthrough is a guided tour of a running order service (make
// dev, or the demo compose stack, which runs it inside its network): it
// creates orders and provokes, one at a time,
// the failures the transactional outbox and the inbox exist for, and shows
// the evidence from the database, the broker and the processes that
// nothing was lost and nothing applied twice:
//
//  1. an order, its outbox row, the relay publishing it, each consumer's
//     inbox row and the order's history;
//  2. a duplicate publish (the same message_id sent again), absorbed by
//     the inbox;
//  3. the consumer killed after its commit and before its ack, and the
//     redelivery deduplicated;
//  4. a poison message parked with its reason while other orders flow;
//  5. cancels racing fulfillment, every order ending consistent.
//
// Each step checks what it shows: the command exits 1 if the system did
// not behave as described, so it doubles as a smoke test.
//
//	walkthrough [-yes] [-timeout 60s]
//
// -yes runs unattended (no pause between steps). Settings, from the
// environment (defaults: the addresses of make dev; the walkthrough
// service of docker-compose.demo.yml sets the compose network's):
//
//	API_URL               order-api                   (http://127.0.0.1:8080)
//	CONSUMER_ADMIN_URL    order-consumer admin        (http://127.0.0.1:9102)
//	WEBHOOK_RECEIVER_URL  webhook receiver; "" skips  (http://127.0.0.1:8090)
//	DATABASE_URL          PostgreSQL, only read       (postgres://postgres:postgres@127.0.0.1:5432/orders)
//	AMQP_URL              RabbitMQ                    (amqp://guest:guest@127.0.0.1:5672/)
//	JAEGER_URL, RABBITMQ_UI_URL, GRAFANA_URL          where the hints point
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
)

// Config is where the running system is.
type Config struct {
	APIURL           string
	ConsumerAdminURL string
	WebhookURL       string
	DatabaseURL      string
	AMQPURL          string
	JaegerURL        string
	RabbitUIURL      string
	GrafanaURL       string
	Timeout          time.Duration
	Yes              bool
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := run(ctx, os.Args[1:], os.LookupEnv, os.Stdin, os.Stdout, os.Stderr)
	var f failure
	switch {
	case err == nil:
	case errors.Is(err, flag.ErrHelp):
		os.Exit(2)
	case errors.As(err, &f):
		fmt.Fprintf(os.Stderr, "\nwalkthrough: FAILED: %v\n", err)
		os.Exit(1)
	default:
		fmt.Fprintf(os.Stderr, "\nwalkthrough: %v\n", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, lookup func(string) (string, bool), stdin io.Reader, stdout, stderr io.Writer) error {
	env := func(name, def string) string {
		if v, ok := lookup(name); ok {
			return v
		}
		return def
	}
	cfg := Config{
		APIURL:           env("API_URL", "http://127.0.0.1:8080"),
		ConsumerAdminURL: env("CONSUMER_ADMIN_URL", "http://127.0.0.1:9102"),
		WebhookURL:       env("WEBHOOK_RECEIVER_URL", "http://127.0.0.1:8090"),
		// The password is the one of docker compose; the local trust
		// authentication of make dev ignores it.
		DatabaseURL: env("DATABASE_URL", "postgres://postgres:postgres@127.0.0.1:5432/orders?sslmode=disable"),
		AMQPURL:     env("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"),
		JaegerURL:   env("JAEGER_URL", "http://localhost:16686"),
		RabbitUIURL: env("RABBITMQ_UI_URL", "http://localhost:15672"),
		GrafanaURL:  env("GRAFANA_URL", "http://localhost:3000"),
	}
	fs := flag.NewFlagSet("walkthrough", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.BoolVar(&cfg.Yes, "yes", false, "run unattended: no pause between steps")
	fs.DurationVar(&cfg.Timeout, "timeout", 60*time.Second, "how long to wait for the system at each step")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %v (try -h)", fs.Args())
	}

	sys, err := connect(ctx, cfg)
	if err != nil {
		return err
	}
	defer sys.close()
	n := &narrator{out: stdout}
	if !cfg.Yes {
		n.in = bufio.NewReader(stdin)
	}
	return tour(ctx, sys, n)
}

// connect checks that the system is up and opens the database and broker.
func connect(ctx context.Context, cfg Config) (*system, error) {
	s := &system{cfg: cfg, http: &http.Client{Timeout: 10 * time.Second}}
	hint := "is the system running? `make dev`; with Docker, run the walkthrough inside the demo stack: " +
		"`docker compose -f docker-compose.yml -f docker-compose.demo.yml run --rm walkthrough`"
	if err := s.ready(ctx, cfg.APIURL+"/readyz"); err != nil {
		return nil, fmt.Errorf("order-api at %s: %w (%s; API_URL)", cfg.APIURL, err, hint)
	}
	if err := s.ready(ctx, cfg.ConsumerAdminURL+"/readyz"); err != nil {
		return nil, fmt.Errorf("order-consumer admin at %s: %w (%s; CONSUMER_ADMIN_URL)", cfg.ConsumerAdminURL, err, hint)
	}
	if cfg.WebhookURL != "" {
		if err := s.ready(ctx, cfg.WebhookURL+"/healthz"); err != nil {
			return nil, fmt.Errorf("webhook receiver at %s: %w (%s; WEBHOOK_RECEIVER_URL, or set it empty)", cfg.WebhookURL, err, hint)
		}
	}
	pool, err := pgxpool.New(ctx, cfg.DatabaseURL)
	if err == nil {
		err = pool.Ping(ctx)
	}
	if err != nil {
		return nil, fmt.Errorf("PostgreSQL (DATABASE_URL): %w", err)
	}
	s.db = pool
	conn, err := amqp.DialConfig(cfg.AMQPURL, amqp.Config{Properties: amqp.Table{"connection_name": "walkthrough"}})
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("RabbitMQ (AMQP_URL): %w", err)
	}
	s.amqp = conn
	return s, nil
}

func (s *system) close() {
	_ = s.amqp.Close()
	s.db.Close()
}
