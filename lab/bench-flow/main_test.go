package main

import (
	"bytes"
	"context"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/yourorg/orders/internal/testenv"
	"github.com/yourorg/orders/lab/sandbox"
)

// bench-flow end to end at a low rate, on the test's PostgreSQL server: it
// builds, starts the flow on a database and vhost of its own, reports every order final with a CPU
// figure for each process, and leaves neither the database nor the vhost
// behind. (What the figures are is the bench's to report, not this test's
// to assert.)
func TestBenchFlowRunsAndCleansUp(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds four binaries and runs the flow")
	}
	// The test servers: the local ones, DATABASE_URL and AMQP_URL's, or
	// containers.
	dbURL := testenv.ServerURL(t, "postgres")
	broker, err := url.Parse(testenv.NewVhost(t))
	if err != nil {
		t.Fatal(err)
	}
	broker.Path = "/"
	env := map[string]string{"DATABASE_URL": dbURL, "AMQP_URL": broker.String()}
	if _, err := sandbox.NewVhostAdmin(t.Context(), broker.String(), ""); err != nil {
		t.Skipf("bench-flow cannot make vhosts on this broker: %v", err)
	}

	var stdout, stderr bytes.Buffer
	err = run(t.Context(), []string{"-rates", "5", "-duration", "2s", "-relays", "1", "-wait", "30s", "-own-postgres=false"},
		func(k string) string { return env[k] }, &stdout, &stderr)
	out := stdout.String()
	if err != nil {
		t.Fatalf("bench-flow: %v\n%s\n%s", err, out, stderr.String())
	}
	if !strings.Contains(out, "| 5 | 10/10 |") {
		t.Errorf("no row with 10 of 10 orders final in the table:\n%s", out)
	}
	for _, row := range []string{"order-api", "outbox-relay-1", "order-consumer", "PostgreSQL, this database's backends",
		"PostgreSQL, the whole server *", "RabbitMQ *", "loadgen (the client)", "machine (every process) *"} {
		if !regexp.MustCompile(`(?m)^\s*` + regexp.QuoteMeta(row) + `\s+-?\d+\.\d\d\s+-?\d+\.\d\d\s`).MatchString(out) {
			t.Errorf("no CPU row for %s:\n%s", row, out)
		}
	}

	name := regexp.MustCompile(`database and vhost (orders_bench_\w+)`).FindStringSubmatch(out)
	if name == nil {
		t.Fatalf("the run does not name its database and vhost:\n%s", out)
	}
	conn, err := pgx.Connect(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var left bool
	if err := conn.QueryRow(context.Background(), "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name[1]).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left {
		t.Errorf("database %s is still there", name[1])
	}
	probe, err := url.Parse(broker.String())
	if err != nil {
		t.Fatal(err)
	}
	probe.Path = "/" + name[1]
	if pingVhost(probe.String()) == nil {
		t.Errorf("vhost %s is still there", name[1])
	}
}

// pingVhost connects to the vhost of amqpURL: an error when it does not
// exist.
func pingVhost(amqpURL string) error {
	conn, err := amqp.DialConfig(amqpURL, amqp.Config{Dial: amqp.DefaultDial(3 * time.Second)})
	if err != nil {
		return err
	}
	return conn.Close()
}

// On a PostgreSQL of its own (the default), bench-flow also reports the
// database's cost per order: the rows each table had written (one order
// is one orders row), the statements by kind and the WAL; and it stops
// that server when it is done.
func TestBenchFlowOnItsOwnPostgres(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds four binaries, starts a PostgreSQL and runs the flow")
	}
	broker, err := url.Parse(testenv.NewVhost(t))
	if err != nil {
		t.Fatal(err)
	}
	broker.Path = "/"
	env := map[string]string{"AMQP_URL": broker.String()}
	if _, err := sandbox.NewVhostAdmin(t.Context(), broker.String(), ""); err != nil {
		t.Skipf("bench-flow cannot make vhosts on this broker: %v", err)
	}
	var stdout, stderr bytes.Buffer
	err = run(t.Context(), []string{"-rates", "5", "-duration", "2s", "-relays", "1", "-wait", "30s"},
		func(k string) string { return env[k] }, &stdout, &stderr)
	out := stdout.String()
	if err != nil {
		t.Fatalf("bench-flow: %v\n%s\n%s", err, out, stderr.String())
	}
	for _, line := range []string{`rows inserted: orders\s+1\.000`, `rows inserted: order_items\s+1\.000`,
		`statements: INSERT\s+[1-9]`, `statements: COMMIT\s+[1-9]`, `WAL bytes\s+[1-9]`, `transactions committed\s+[1-9]`,
		`PostgreSQL, the whole server\s+\d`} {
		if !regexp.MustCompile(`(?m)^\s*` + line).MatchString(out) {
			t.Errorf("no line matching %q in:\n%s", line, out)
		}
	}
	server := regexp.MustCompile(`PostgreSQL of its own: (\S+)`).FindStringSubmatch(out)
	if server == nil {
		t.Fatalf("the run does not name its PostgreSQL:\n%s", out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if conn, err := pgx.Connect(ctx, server[1]); err == nil {
		_ = conn.Close(ctx)
		t.Errorf("its PostgreSQL %s still takes connections", server[1])
	}
}

// make bench/api's mode, briefly, on the test's PostgreSQL server: both
// loops write every order, the ratio is printed, and no database is left.
func TestBenchAPIRunsAndCleansUp(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds two binaries and runs order-api")
	}
	dbURL := testenv.ServerURL(t, "postgres")
	var stdout, stderr bytes.Buffer
	err := run(t.Context(), []string{"-closed", "2", "-orders", "20", "-rounds", "1", "-own-postgres=false"},
		func(k string) string { return map[string]string{"DATABASE_URL": dbURL}[k] }, &stdout, &stderr)
	out := stdout.String()
	if err != nil {
		t.Fatalf("bench-flow -closed: %v\n%s\n%s", err, out, stderr.String())
	}
	for _, line := range []string{`round 1, raw \(database orders_closed_\w+\): 20 orders in`, `round 1, api \(database orders_closed_\w+\): 20 orders in`,
		`order-api\s+\d+\.\d\d s`, `loadgen \(the client\)\s+\d+\.\d\d s`,
		`POST /v1/orders \d+ orders/s, raw pgx loop \d+ tx/s: ratio \d+\.\d\d`} {
		if !regexp.MustCompile(`(?m)^\s*` + line).MatchString(out) {
			t.Errorf("no line matching %q in:\n%s", line, out)
		}
	}
	conn, err := pgx.Connect(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	for _, name := range regexp.MustCompile(`database (orders_closed_\w+)`).FindAllStringSubmatch(out, -1) {
		var left bool
		if err := conn.QueryRow(context.Background(), "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name[1]).Scan(&left); err != nil {
			t.Fatal(err)
		}
		if left {
			t.Errorf("database %s is still there", name[1])
		}
	}
}
