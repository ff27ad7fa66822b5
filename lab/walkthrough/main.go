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
//	DATABASE_URL          PostgreSQL, only read       (postgres://orders_operator@127.0.0.1:5432/orders)
//	AMQP_URL              RabbitMQ                    (amqp://guest:guest@127.0.0.1:5672/)
//	DATABASE_PASSWORD_FILE, AMQP_PASSWORD_FILE        the password of the URL's user, in a file (the demo stack's secrets)
//	JAEGER_URL, RABBITMQ_UI_URL, GRAFANA_URL, PROMETHEUS_URL   the web UIs, checked to choose the hints
//	                      (http://localhost:16686, :15672, :3000; Prometheus: none, the
//	                      consumer's /metrics instead)
//	API_BROWSER_URL, JAEGER_BROWSER_URL, RABBITMQ_UI_BROWSER_URL, GRAFANA_BROWSER_URL, PROMETHEUS_BROWSER_URL
//	                      where the links it prints send your browser, when that is not where
//	                      the walkthrough itself reaches them (default: API_URL, JAEGER_URL, ...);
//	                      in the demo compose stack, the walkthrough reaches the services by
//	                      their names inside the network and your browser their published ports
//	API_TOKEN             order-api's bearer token    (an operator's: it creates, reads and cancels orders)
//	API_JWT_SECRET        without API_TOKEN, mint an operator token with the API's secret
//	                      (make walkthrough passes make dev's; API_JWT_SECRET_FILE, the demo stack's)
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
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/yourorg/orders/internal/auth"
	"github.com/yourorg/orders/internal/config"
	"github.com/yourorg/orders/internal/consumer"
	"github.com/yourorg/orders/internal/messaging/inbox"
	"github.com/yourorg/orders/internal/messaging/inbox/inboxadmin"
	"github.com/yourorg/orders/internal/messaging/outbox/outboxadmin"
)

// Config is where the running system is. The walkthrough reaches each
// part at its ...URL; the links it prints for the reader's browser use the
// Browser ones, which differ when the walkthrough runs inside the compose
// network (order-api:8080 there, localhost:8080 in the browser).
type Config struct {
	APIURL           string
	APIToken         string // sent to order-api as a bearer token
	ConsumerAdminURL string
	WebhookURL       string
	DatabaseURL      string
	AMQPURL          string
	JaegerURL        string
	RabbitUIURL      string
	GrafanaURL       string
	PrometheusURL    string
	// The same for the reader's browser: the timeline page and the UIs.
	APIBrowserURL        string
	JaegerBrowserURL     string
	RabbitUIBrowserURL   string
	GrafanaBrowserURL    string
	PrometheusBrowserURL string
	Timeout              time.Duration
	Yes                  bool
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
	cfg := configFrom(env)
	var err error
	// The demo stack gives the passwords in files of its secrets volume.
	if file := env("DATABASE_PASSWORD_FILE", ""); file != "" {
		if cfg.DatabaseURL, err = config.URLWithPasswordFile(cfg.DatabaseURL, file); err != nil {
			return fmt.Errorf("DATABASE_URL, DATABASE_PASSWORD_FILE: %w", err)
		}
	}
	if file := env("AMQP_PASSWORD_FILE", ""); file != "" {
		if cfg.AMQPURL, err = config.URLWithPasswordFile(cfg.AMQPURL, file); err != nil {
			return fmt.Errorf("AMQP_URL, AMQP_PASSWORD_FILE: %w", err)
		}
	}
	if cfg.APIToken, err = auth.ClientToken(func(name string) string { return env(name, "") }); err != nil {
		return err
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

// configFrom reads the addresses from env (a variable's value, else def):
// by default those of make dev, where the walkthrough and the browser
// reach everything at the same address.
func configFrom(env func(name, def string) string) Config {
	cfg := Config{
		APIURL:           env("API_URL", "http://127.0.0.1:8080"),
		ConsumerAdminURL: env("CONSUMER_ADMIN_URL", "http://127.0.0.1:9102"),
		WebhookURL:       env("WEBHOOK_RECEIVER_URL", "http://127.0.0.1:8090"),
		// make dev's server trusts its local roles: no password.
		DatabaseURL: env("DATABASE_URL", "postgres://orders_operator@127.0.0.1:5432/orders?sslmode=disable"),
		AMQPURL:     env("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"),
		JaegerURL:   env("JAEGER_URL", "http://localhost:16686"),
		RabbitUIURL: env("RABBITMQ_UI_URL", "http://localhost:15672"),
		GrafanaURL:  env("GRAFANA_URL", "http://localhost:3000"),
		// make dev runs no Prometheus; the consumer's /metrics is at hand.
		PrometheusURL: env("PROMETHEUS_URL", ""),
	}
	cfg.APIBrowserURL = env("API_BROWSER_URL", cfg.APIURL)
	cfg.JaegerBrowserURL = env("JAEGER_BROWSER_URL", cfg.JaegerURL)
	cfg.RabbitUIBrowserURL = env("RABBITMQ_UI_BROWSER_URL", cfg.RabbitUIURL)
	cfg.GrafanaBrowserURL = env("GRAFANA_BROWSER_URL", cfg.GrafanaURL)
	cfg.PrometheusBrowserURL = env("PROMETHEUS_BROWSER_URL", cfg.PrometheusURL)
	return cfg
}

// connect checks, before step 1, that the walkthrough sees the whole
// system, and the same system the processes use: order-api, the
// consumer's admin endpoints and the webhook receiver answer; the database
// answers and holds the schema, and order-api's newest order is in it; the
// RabbitMQ vhost answers and holds the consumers' queues. It names every
// part it cannot see, not only the first. It also finds out which of
// Jaeger, the RabbitMQ management UI and Grafana answer, for the hints.
func connect(ctx context.Context, cfg Config) (*system, error) {
	s := &system{cfg: cfg, http: &http.Client{Timeout: 10 * time.Second}}
	var missing []string
	miss := func(format string, args ...any) { missing = append(missing, fmt.Sprintf(format, args...)) }
	hint := "is the system running? `make dev`; with Docker, start the demo stack and run the walkthrough inside it: " +
		"`" + demoUp + "`, then `docker compose -f docker-compose.yml -f docker-compose.demo.yml run --rm walkthrough`"
	if err := s.ready(ctx, cfg.APIURL+"/readyz"); err != nil {
		miss("order-api at %s (API_URL): %v", cfg.APIURL, err)
	} else if code, err := s.do(ctx, http.MethodGet, cfg.APIURL+"/v1/orders?limit=1", nil, nil, nil); err == nil &&
		(code == http.StatusUnauthorized || code == http.StatusForbidden) {
		miss("order-api at %s answers %d: it needs an operator's token (API_TOKEN: `make token ARGS=-operator`; "+
			"or API_JWT_SECRET, the API's development secret, to mint one)", cfg.APIURL, code)
	}
	if err := s.ready(ctx, cfg.ConsumerAdminURL+"/readyz"); err != nil {
		miss("order-consumer's admin endpoints at %s (CONSUMER_ADMIN_URL): %v", cfg.ConsumerAdminURL, err)
	}
	if cfg.WebhookURL != "" {
		if err := s.ready(ctx, cfg.WebhookURL+"/healthz"); err != nil {
			miss("the webhook receiver at %s (WEBHOOK_RECEIVER_URL, or set it empty): %v", cfg.WebhookURL, err)
		}
	}

	dbName := describeDatabase(cfg.DatabaseURL)
	pool, err := pgxpool.New(ctx, cfg.DatabaseURL)
	if err == nil {
		pingCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err = pool.Ping(pingCtx)
		cancel()
	}
	switch {
	case err != nil:
		miss("PostgreSQL, %s (DATABASE_URL): %v", dbName, err)
	default:
		s.db = pool
		if problem := s.checkDatabase(ctx); problem != "" {
			miss("PostgreSQL, %s (DATABASE_URL): %s", dbName, problem)
		}
	}

	vhostName := describeVhost(cfg.AMQPURL)
	conn, err := amqp.DialConfig(cfg.AMQPURL, amqp.Config{Properties: amqp.Table{"connection_name": "walkthrough"}, Dial: amqp.DefaultDial(5 * time.Second)})
	switch {
	case err != nil:
		miss("RabbitMQ, %s (AMQP_URL): %v%s", vhostName, err, refusedHint(err))
	default:
		s.amqp = conn
		if problem := s.checkVhost(); problem != "" {
			miss("RabbitMQ, %s (AMQP_URL): %s", vhostName, problem)
		}
	}

	if len(missing) > 0 {
		s.close()
		return nil, fmt.Errorf("the walkthrough cannot see the whole system; it runs only against one it can see:\n  - %s\n"+
			"(%s; the variables name where the walkthrough looks: docs/walkthrough.md)",
			strings.Join(missing, "\n  - "), hint)
	}
	s.where = fmt.Sprintf("order-api %s, order-consumer %s,\nPostgreSQL %s, RabbitMQ %s", cfg.APIURL, cfg.ConsumerAdminURL, dbName, vhostName)
	s.lookForUIs(ctx)
	return s, nil
}

// demoUp starts the demo stack, and recreates what differs from it in a
// stack that runs already (docker-compose.demo.yml).
const demoUp = "docker compose -f docker-compose.yml -f docker-compose.demo.yml up --build -d --wait"

// refusedHint says, for a broker that refuses AMQP_URL's user, how it gets
// that user: a compose broker imports its users when it starts, so one
// started without the demo's definitions must start again with them (the
// demo's `up` recreates it); make dev creates them before it starts the
// processes.
func refusedHint(err error) string {
	var refused *amqp.Error
	if !errors.As(err, &refused) || refused.Code != amqp.AccessRefused {
		return ""
	}
	return "; the broker does not know the user, or not its password. It imports its users when it starts: with Docker, `" +
		demoUp + "` starts it again with the walkthrough's; make dev creates them (lab/rabbitmq-users)"
}

// lookForUIs finds out which of Jaeger, the RabbitMQ management UI,
// Grafana and Prometheus answer where the walkthrough reaches them (JAEGER_URL, ...): the
// hints then send the browser to them (JAEGER_BROWSER_URL, ...).
func (s *system) lookForUIs(ctx context.Context) {
	s.jaeger, s.rabbitUI, s.grafana = s.answers(ctx, s.cfg.JaegerURL), s.answers(ctx, s.cfg.RabbitUIURL), s.answers(ctx, s.cfg.GrafanaURL)
	s.prometheus = s.answers(ctx, s.cfg.PrometheusURL)
}

// checkDatabase says what is wrong with the database for the walkthrough,
// or "": the schema must be there, and order-api's newest order in it (or
// order-api must have none yet), else the walkthrough reads another
// database than the one order-api writes.
func (s *system) checkDatabase(ctx context.Context) string {
	var migrated bool
	if err := s.db.QueryRow(ctx, `SELECT to_regclass('orders') IS NOT NULL`).Scan(&migrated); err != nil {
		return fmt.Sprintf("cannot read it: %v", err)
	}
	_, outboxErr := outboxadmin.Stats(ctx, s.db)
	_, inboxErr := inboxadmin.Stats(ctx, s.db)
	if err := errors.Join(outboxErr, inboxErr); !migrated || err != nil {
		return fmt.Sprintf("it has no orders table, or cannot read the outbox and the inbox (%v): not the database order-api uses, or not migrated (make migrate)", err)
	}
	var page struct {
		Orders []struct {
			ID string `json:"order_id"`
		} `json:"orders"`
	}
	if code, err := s.do(ctx, http.MethodGet, s.cfg.APIURL+"/v1/orders?limit=1", nil, nil, &page); err != nil || code != http.StatusOK || len(page.Orders) == 0 {
		return "" // order-api has no order yet (or did not answer: said above)
	}
	var found bool
	if err := s.db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM orders WHERE order_id = $1)`, page.Orders[0].ID).Scan(&found); err != nil {
		return fmt.Sprintf("cannot read it: %v", err)
	}
	if !found {
		return fmt.Sprintf("order-api's newest order %s is not in it: order-api writes to another database", page.Orders[0].ID)
	}
	return ""
}

// checkVhost says what is wrong with the vhost for the walkthrough, or "":
// the parking lot of every consumer must be there (it is, with or without
// MESSAGE_PARTITIONS), else order-consumer uses another vhost (or has
// never started).
func (s *system) checkVhost() string {
	var absent []string
	for _, c := range consumer.All(consumer.Deps{}) {
		ch, err := s.amqp.Channel()
		if err != nil {
			return fmt.Sprintf("cannot open a channel: %v", err)
		}
		lot := inbox.ParkingLotName(inbox.QueueName(c.Name()))
		if _, err := ch.QueueDeclarePassive(lot, true, false, false, false, nil); err != nil {
			absent = append(absent, lot)
		}
		_ = ch.Close() // a failed passive declare closed it already
	}
	if len(absent) > 0 {
		return fmt.Sprintf("it has no queue %s: not the vhost order-consumer uses, or order-consumer never started", strings.Join(absent, ", "))
	}
	return ""
}

// describeDatabase names the database of a URL for people: its name and
// server, never its password.
func describeDatabase(url string) string {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return "(DATABASE_URL does not parse)"
	}
	return fmt.Sprintf("database %q on %s:%d", cfg.Database, cfg.Host, cfg.Port)
}

// describeVhost names the vhost of an AMQP URL for people: its name and
// server, never its password.
func describeVhost(url string) string {
	uri, err := amqp.ParseURI(url)
	if err != nil {
		return "(AMQP_URL does not parse)"
	}
	return fmt.Sprintf("vhost %q on %s:%d", uri.Vhost, uri.Host, uri.Port)
}

// answers reports whether a web UI answers at url (any answer but a 5xx).
func (s *system) answers(ctx context.Context, url string) bool {
	if url == "" {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false
	}
	resp, err := s.http.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode < 500
}

func (s *system) close() {
	if s.amqp != nil {
		_ = s.amqp.Close()
	}
	if s.db != nil {
		s.db.Close()
	}
}
