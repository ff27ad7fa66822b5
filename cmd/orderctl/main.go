// Command orderctl is the operator's tool for the order service: what is
// stuck and what to do about it, one order's whole story, and the repairs
// of docs/operations.md (retry FAILED outbox rows, replay or discard parked
// messages, run retention), each recorded in operator_audit with who, when,
// what and why.
//
//	orderctl status                                      what is stuck, queue depths, what to do next
//	orderctl order <order_id>                            the order's timeline: history, outbox, inbox, parked, trace id
//	orderctl outbox failed [--type T]                    FAILED outbox rows
//	orderctl outbox retry <outbox_id>...|--type T        FAILED rows back to PENDING
//	orderctl parked list <consumer>                      a parking lot, left as it is
//	orderctl parked show <consumer> <message_id>         one parked message: headers, reason, body
//	orderctl parked replay <consumer> <message_id>|--all back to the work queue, same message id
//	orderctl parked discard <consumer> <message_id>      out of the parking lot for good
//	orderctl inbox show <consumer> <message_id>          one inbox row
//	orderctl retention                                   drop and delete what the retention settings allow, now
//	orderctl audit                                       what operators did
//	orderctl token -customer ID | -operator [-ttl 1h]    a development bearer token for order-api
//
// Every command takes --json; those that change something (retry, replay,
// discard, retention) need --reason. A replay leaves parked a message first
// delivered longer ago than CONSUMER_REPLAY_WINDOW, whose inbox row may be
// gone (it could be applied twice), and says so; --past-window replays it
// anyway. The settings are the services'
// (README, "Configuration"); ORDERCTL_USER names the operator in the audit
// table (default: the OS user; in docker compose, ORDERS_ORDERCTL_USER of
// .env). `token` signs with API_JWT_SECRET and
// needs no database.
//
// orderctl works on the database and the broker directly: the access its
// DATABASE_URL and AMQP_URL grant is what lets it in, not order-api's
// tokens or rules (README, "Authentication").
package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/user"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/yourorg/orders/internal/app"
	"github.com/yourorg/orders/internal/config"
	"github.com/yourorg/orders/internal/consumer"
	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/messaging"
	"github.com/yourorg/orders/internal/telemetry"
)

const service = "orderctl"

// Config is every setting orderctl reads; see the README for the table.
type Config struct {
	config.Environment
	config.Database
	config.Log
	// AMQPURL is the RabbitMQ broker: the parking lots and queue depths.
	// A URL, or the URLs of a cluster's nodes separated by commas.
	AMQPURL string `env:"AMQP_URL" envDefault:"amqp://guest:guest@127.0.0.1:5672/" passwordFile:"AMQP_PASSWORD_FILE"`
	// User names the operator in operator_audit; empty: the OS user.
	User string `env:"ORDERCTL_USER"`
	// RetryDelays are order-consumer's, to find its retry queues.
	RetryDelays []time.Duration `env:"CONSUMER_RETRY_DELAYS" envDefault:"1s,5s,30s,2m" envSeparator:","`
	// Partitions are order-consumer's (MESSAGE_PARTITIONS), to find its
	// work queues: one per partition, and then no retry queues.
	config.Partitions
	// The retention windows of `orderctl retention` are the services' own
	// (0: keep forever).
	OutboxRetention   time.Duration `env:"RELAY_RETENTION" envDefault:"168h"`
	InboxRetention    time.Duration `env:"CONSUMER_INBOX_RETENTION" envDefault:"720h"`
	ReplayWindow      time.Duration `env:"CONSUMER_REPLAY_WINDOW" envDefault:"168h"`
	IdempotencyKeyTTL time.Duration `env:"IDEMPOTENCY_KEY_TTL" envDefault:"24h"`
	// The API's token settings, with which `orderctl token` signs.
	JWTSecret   string `env:"API_JWT_SECRET" secret:"true" fromFile:"API_JWT_SECRET_FILE"`
	JWTIssuer   string `env:"API_JWT_ISSUER"`
	JWTAudience string `env:"API_JWT_AUDIENCE"`
}

// Validate checks every setting and reports all the bad ones.
func (c *Config) Validate() error {
	errs := []error{c.Database.Validate(), c.Log.Validate(), c.Partitions.Validate(), config.Positive("IDEMPOTENCY_KEY_TTL", c.IdempotencyKeyTTL),
		config.Named("AMQP_URL", messaging.CheckURL(c.AMQPURL))}
	for _, d := range c.RetryDelays {
		errs = append(errs, config.Positive("CONSUMER_RETRY_DELAYS", d))
	}
	if c.OutboxRetention < 0 || c.InboxRetention < 0 {
		errs = append(errs, errors.New("RELAY_RETENTION and CONSUMER_INBOX_RETENTION must not be negative"))
	}
	if c.InboxRetention > 0 && c.InboxRetention < c.ReplayWindow {
		errs = append(errs, fmt.Errorf("CONSUMER_INBOX_RETENTION (%s) is shorter than CONSUMER_REPLAY_WINDOW (%s), as order-consumer refuses", c.InboxRetention, c.ReplayWindow))
	}
	return errors.Join(errs...)
}

// ctl is what every command gets: the settings, the database, the
// operator's name, and its flags.
type ctl struct {
	cfg  Config
	pool *pgxpool.Pool
	log  *slog.Logger
	user string
	args args
}

// report is a command's result: printed for people, or as JSON with
// --json.
type report interface {
	human(w io.Writer)
}

// command is one command of orderctl. Its arguments are checked before
// anything connects anywhere.
type command struct {
	name     string // "outbox retry"
	usage    string // the arguments
	help     string
	min, max int  // how many positional arguments (max -1: any number)
	consumer bool // the first argument names a consumer
	changes  bool // it changes something: --reason is required, and it is audited
	run      func(ctx context.Context, c *ctl) (report, error)
}

var commands = []command{
	{"status", "", "backlogs, queue depths and the oldest stuck items, each with what to do next", 0, 0, false, false, status},
	{"order", "<order_id>", "one order's timeline: history, outbox and inbox rows, parked messages, trace id", 1, 1, false, false, orderTimeline},
	{"outbox failed", "[--type T] [--limit N]", "FAILED outbox rows, oldest first", 0, 0, false, false, outboxFailed},
	{"outbox retry", "<outbox_id>... | --type T  --reason R", "put FAILED rows back to PENDING (same id, attempts reset)", 0, -1, false, true, outboxRetry},
	{"parked list", "<consumer> [--limit N]", "the messages in a parking lot (left there)", 1, 1, true, false, parkedList},
	{"parked show", "<consumer> <message_id>", "one parked message: headers, reason, body, its inbox row (left there)", 2, 2, true, false, parkedShow},
	{"parked replay", "<consumer> <message_id>|--all [--limit N] [--past-window] --reason R", "move parked messages back to the work queue, same message id; not those first delivered longer ago than CONSUMER_REPLAY_WINDOW, unless --past-window", 1, 2, true, true, parkedReplay},
	{"parked discard", "<consumer> <message_id> --reason R", "remove a parked message for good (its headers are kept in the audit)", 2, 2, true, true, parkedDiscard},
	{"inbox show", "<consumer> <message_id>", "one inbox row", 2, 2, true, false, inboxShow},
	{"retention", "--reason R", "drop the outbox's time partitions, delete processed inbox rows and expired idempotency keys past their retention, now", 0, 0, false, true, retention},
	{"audit", "[--limit N]", "what operators did, newest first", 0, 0, false, false, auditList},
	{"token", "-customer ID | -operator [-ttl 1h]", "a development bearer token for order-api, signed with API_JWT_SECRET (no database)", 0, 0, false, false, token},
}

func main() { app.Main(service, run) }

// run is the whole process; environ replaces the process environment when
// not nil (tests).
func run(ctx context.Context, argv []string, environ map[string]string, stdout, stderr io.Writer) error {
	// Configuration and command line.
	var cfg Config
	if err := config.Load(&cfg, environ); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			// Under compose, orderctl starts nothing: the secrets are
			// made by the stack's `up` (docker-compose.yml).
			return fmt.Errorf("%w\n(a secret file is missing: with docker compose, start the stack first: docker compose up -d --wait)", err)
		}
		return err
	}
	cmd, a, err := parse(argv, stderr)
	if err != nil {
		return err
	}
	c := &ctl{cfg: cfg, args: a, log: telemetry.NewLogger(service, cfg.Log, stderr)}
	if c.user, err = operator(cfg.User); err != nil {
		return err
	}

	// A token needs no database.
	if cmd.name == "token" {
		if err := checkToken(a, cfg.JWTSecret); err != nil {
			return err
		}
		r, err := token(ctx, c)
		if err != nil {
			return err
		}
		return c.print(r, stdout)
	}

	// Database.
	if cfg.MigrateOnStart {
		if err := app.RunMigrate(ctx, cfg.Database, nil, c.log, io.Discard); err != nil {
			return err
		}
	}
	c.pool, err = database.NewPool(ctx, database.PoolConfig{
		URL: cfg.URL, MaxConns: min(cfg.MaxConns, 4), AppName: service, ConnectTimeout: cfg.ConnectTimeout,
		StatementTimeout: cfg.StatementTimeout, LockTimeout: cfg.LockTimeout,
	})
	if err != nil {
		return err
	}
	defer c.pool.Close()

	// The command, and its output.
	r, err := cmd.run(ctx, c)
	if err != nil {
		return err
	}
	return c.print(r, stdout)
}

// print writes a command's report: for people, or as JSON with --json.
func (c *ctl) print(r report, stdout io.Writer) error {
	if c.args.json {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(r)
	}
	r.human(stdout)
	return nil
}

// args are a command's arguments and flags. Flags may come anywhere
// (orderctl parked replay fulfillment <id> --reason "...").
type args struct {
	pos    []string
	json   bool
	all    bool
	reason string
	typ    string
	limit  int
	// parked replay: the messages past the replay window too
	pastWindow bool
	// token
	customer string
	operator bool
	ttl      time.Duration
}

func parse(argv []string, stderr io.Writer) (command, args, error) {
	fs := flag.NewFlagSet(service, flag.ContinueOnError)
	fs.SetOutput(stderr)
	var a args
	fs.BoolVar(&a.json, "json", false, "print JSON")
	fs.BoolVar(&a.all, "all", false, "parked replay: every parked message of the consumer")
	fs.BoolVar(&a.pastWindow, "past-window", false, "parked replay: also the messages first delivered longer ago than CONSUMER_REPLAY_WINDOW, whose inbox rows may be gone: each may be applied twice")
	fs.StringVar(&a.reason, "reason", "", "why: required by every command that changes something, kept in operator_audit")
	fs.StringVar(&a.typ, "type", "", "a message type")
	fs.IntVar(&a.limit, "limit", 0, "at most this many")
	fs.StringVar(&a.customer, "customer", "", "token: for this customer id (its sub)")
	fs.BoolVar(&a.operator, "operator", false, "token: for an operator (sub: dev-operator:<ORDERCTL_USER, else the OS user>)")
	fs.DurationVar(&a.ttl, "ttl", time.Hour, "token: how long it is valid")
	fs.Usage = func() { usage(stderr, fs) }
	for rest := argv; ; {
		if err := fs.Parse(rest); err != nil {
			return command{}, a, err
		}
		if fs.NArg() == 0 {
			break
		}
		a.pos, rest = append(a.pos, fs.Arg(0)), fs.Args()[1:]
	}
	if a.limit < 0 {
		return command{}, a, errors.New("--limit must not be negative")
	}
	// The longest command name that the arguments start with.
	for _, n := range []int{2, 1} {
		if len(a.pos) < n {
			continue
		}
		name := strings.Join(a.pos[:n], " ")
		for _, cmd := range commands {
			if cmd.name == name {
				a.pos = a.pos[n:]
				return cmd, a, cmd.check(a)
			}
		}
	}
	fs.Usage()
	if len(a.pos) == 0 {
		return command{}, a, errors.New("name a command")
	}
	return command{}, a, fmt.Errorf("unknown command %q", strings.Join(a.pos, " "))
}

func usage(w io.Writer, fs *flag.FlagSet) {
	_, _ = fmt.Fprintf(w, "usage: %s <command> [arguments] [--json]\n\n", service)
	for _, c := range commands {
		_, _ = fmt.Fprintf(w, "  %s %s\n      %s\n", c.name, c.usage, c.help)
	}
	_, _ = fmt.Fprintf(w, "\nflags:\n")
	fs.PrintDefaults()
	_, _ = fmt.Fprintf(w, "\nConfiguration is read from the environment (README.md); ORDERCTL_USER names you in the audit.\n")
}

// operator is who runs orderctl: ORDERCTL_USER, else the OS user.
func operator(configured string) (string, error) {
	if configured != "" {
		return configured, nil
	}
	if u, err := user.Current(); err == nil && u.Username != "" {
		return u.Username, nil
	}
	if u := os.Getenv("USER"); u != "" {
		return u, nil
	}
	return "", errors.New("cannot tell who you are: set ORDERCTL_USER")
}

// check checks the arguments of a command.
func (cmd command) check(a args) error {
	if n := len(a.pos); n < cmd.min || (cmd.max >= 0 && n > cmd.max) {
		return fmt.Errorf("%s: want %s", cmd.name, cmp.Or(cmd.usage, "no arguments"))
	}
	if cmd.consumer && !slices.Contains(consumer.Names(), a.pos[0]) {
		return fmt.Errorf("%s: %q is not a consumer; there are %v", cmd.name, a.pos[0], consumer.Names())
	}
	if cmd.changes && strings.TrimSpace(a.reason) == "" {
		return fmt.Errorf(`%s: --reason is required: say why ("--reason 'binding fixed in #123'"); it is kept in operator_audit`, cmd.name)
	}
	return nil
}

// table prints rows under a header, in aligned columns.
func table(w io.Writer, header []string, rows [][]string) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	_, _ = fmt.Fprintln(tw, strings.Join(header, "\t"))
	for _, r := range rows {
		_, _ = fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	_ = tw.Flush()
}

// when prints a time for people: UTC to the millisecond, or "-".
func when(t *time.Time) string {
	if t == nil || t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05.000")
}

// age prints a duration for people, rounded.
func age(d time.Duration) string {
	switch {
	case d >= time.Hour:
		return d.Round(time.Minute).String()
	case d >= time.Second:
		return d.Round(time.Second).String()
	}
	return d.Round(time.Millisecond).String()
}

// orDash prints "-" for an empty string.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
