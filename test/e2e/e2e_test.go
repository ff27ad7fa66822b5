// Package e2e runs the three binaries as processes, the way they run in
// production, against the test PostgreSQL and RabbitMQ, and drives orders
// through them over HTTP.
package e2e

import (
	"bytes"
	"context"
	cryptorand "crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/yourorg/orders/api/apicheck"
	"github.com/yourorg/orders/internal/auth"
	"github.com/yourorg/orders/internal/messaging/outbox"
	"github.com/yourorg/orders/internal/testenv"
	"github.com/yourorg/orders/internal/testenv/failover"
	"github.com/yourorg/orders/migrations"
)

// binaries builds the three commands once per test run.
var binaries = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "orders-e2e-bin-")
	if err != nil {
		return "", err
	}
	cmd := exec.Command("go", "build", "-o", dir+"/", "../../cmd/order-api", "../../cmd/outbox-relay", "../../cmd/order-consumer")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build: %w\n%s", err, out)
	}
	return dir, nil
})

// process is one running binary.
type process struct {
	name string
	cmd  *exec.Cmd
	log  *bytes.Buffer
	mu   *sync.Mutex
	done chan error
}

type system struct {
	t       *testing.T
	bin     string
	env     []string
	apiURL  string
	client  *http.Client // for the API: checks every exchange against api/openapi.yaml
	token   string       // an operator's token for the API
	secret  string       // the API's JWT secret
	procs   map[string]*process
	admin   map[string]string // a consumer's admin address, by name
	dbURL   string
	amqpURL string
	// procDBURL is where the processes connect (as their roles): dbURL, or
	// a pooler in front of it.
	procDBURL string
}

func newSystem(t *testing.T) *system {
	t.Helper()
	return newSystemOn(t, testenv.NewVhost)
}

// newSystemOn is newSystem on the broker vhost that vhost makes for t
// (testenv.NewVhost, or a cluster's NewVhost: AMQP_URL for the processes).
func newSystemOn(t *testing.T, vhost func(testing.TB) string) *system {
	t.Helper()
	name := testenv.TestDatabaseName()
	testenv.DropDatabaseAtCleanup(t, name)
	return newSystemAt(t, testenv.ServerURL(t, name), vhost(t)) // first: under -short they skip, before the build
}

// newWALSystem is newSystem with its relays in RELAY_MODE=wal: its
// database is on the test binary's PostgreSQL with wal_level=logical
// (testenv.LogicalPostgres), migrate makes the replication role, and the
// relays stream a slot of the test's own as it (RELAY_WAL_DATABASE_URL),
// with a heartbeat and sweep delay as short as the relay's own tests'.
func newWALSystem(t *testing.T) *system {
	t.Helper()
	db := testenv.LogicalPostgres(t).NewDatabase(t, migrations.Schemas...)
	s := newSystemAt(t, db.URL, testenv.NewVhost(t), "MIGRATE_RELAY_WAL_ROLE=true")
	s.env = append(s.env, "RELAY_MODE=wal", "RELAY_WAL_SLOT=relay_"+db.Name,
		"RELAY_WAL_DATABASE_URL="+db.URLAs(migrations.RoleRelayWAL), "RELAY_WAL_HEARTBEAT=500ms", "RELAY_WAL_SWEEP_AFTER=5s")
	return s
}

// newSystemAt is a system on the database of dbURL, which migrate makes
// if it is missing, with migrate's environment migrateEnv.
func newSystemAt(t *testing.T, dbURL, amqpURL string, migrateEnv ...string) *system {
	t.Helper()
	bin, err := binaries()
	if err != nil {
		t.Fatal(err)
	}
	s := &system{t: t, bin: bin, client: apicheck.Client(t), procs: map[string]*process{}, admin: map[string]string{}, dbURL: dbURL, procDBURL: dbURL, amqpURL: amqpURL}
	// The schema's owner (the server's superuser here) migrates, as the
	// migrate service does in compose; each process then connects as its
	// own role (start), so a grant it lacks fails the flow.
	migrate := exec.Command(filepath.Join(bin, "order-api"), "migrate", "up")
	migrate.Env = append(append(os.Environ(), "DATABASE_URL="+dbURL, "LOG_FORMAT=json"), migrateEnv...)
	if out, err := migrate.CombinedOutput(); err != nil {
		t.Fatalf("order-api migrate up: %v\n%s", err, out)
	}
	s.env = append([]string{"AMQP_URL=" + s.amqpURL}, failover.ProcessEnv...)
	t.Cleanup(func() {
		for _, p := range s.procs {
			_ = p.cmd.Process.Kill()
		}
		if t.Failed() {
			for name, p := range s.procs {
				p.mu.Lock()
				t.Logf("--- %s log (last 4 KiB):\n%s", name, tail(p.log.String(), 4096))
				p.mu.Unlock()
			}
		}
	})
	return s
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// processRoles are the PostgreSQL roles the binaries connect as
// (migrations/00008_roles.sql), as in docker-compose.yml and make dev.
var processRoles = map[string]string{
	"order-api":      migrations.RoleAPI,
	"outbox-relay":   migrations.RoleRelay,
	"order-consumer": migrations.RoleConsumer,
}

// start runs binary as process name with extra environment, and waits
// until its readiness endpoint answers 200 (order-api's through s.client).
func (s *system) start(name, binary, readyURL string, args []string, env ...string) *process {
	s.t.Helper()
	p := s.launch(name, binary, args, env...)
	client := http.DefaultClient // the admin endpoints of the relay and the consumer
	if binary == "order-api" {
		client = s.client
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := client.Get(readyURL)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p
			}
		}
		select {
		case err := <-p.done:
			s.t.Fatalf("%s exited: %v\n%s", name, err, p.log.String())
		default:
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("%s never became ready", name)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// launch runs binary as process name with extra environment, and returns
// at once.
func (s *system) launch(name, binary string, args []string, env ...string) *process {
	s.t.Helper()
	cmd := exec.Command(filepath.Join(s.bin, binary), args...)
	cmd.Env = s.processEnv(binary, env...)
	p := &process{name: name, cmd: cmd, log: &bytes.Buffer{}, mu: &sync.Mutex{}, done: make(chan error, 1)}
	cmd.Stdout = lockedWriter{p.mu, p.log}
	cmd.Stderr = lockedWriter{p.mu, p.log}
	if err := cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	go func() { p.done <- cmd.Wait() }()
	s.procs[name] = p
	return p
}

// processEnv is the environment of a process of binary: the system's,
// its database role's URL, and env.
func (s *system) processEnv(binary string, env ...string) []string {
	s.t.Helper()
	role, ok := processRoles[binary]
	if !ok {
		s.t.Fatalf("%s has no database role", binary)
	}
	return slices.Concat(os.Environ(), s.env, []string{"DATABASE_URL=" + testenv.AsRole(s.procDBURL, role)}, env)
}

// startAPI starts order-api with a secret of the test's and extra
// environment, and mints an operator's token for it (s.token).
func (s *system) startAPI(env ...string) {
	addr := testenv.FreeAddr(s.t)
	s.apiURL = "http://" + addr
	secret := cryptorand.Text() + cryptorand.Text()
	token, err := auth.Mint([]byte(secret), auth.Principal{Subject: "e2e", Role: auth.RoleOperator}, 2*time.Hour, "", "")
	if err != nil {
		s.t.Fatal(err)
	}
	s.token, s.secret = token, secret
	s.start("order-api", "order-api", s.apiURL+"/readyz", nil, slices.Concat([]string{"HTTP_ADDR=" + addr,
		"API_AUTH=jwt", "API_JWT_SECRET=" + secret, "API_JWT_PUBLIC_KEYS=", "API_JWT_ISSUER=", "API_JWT_AUDIENCE="}, env)...)
}

// startRelay starts an outbox-relay and returns its admin address.
func (s *system) startRelay(name string) string {
	addr := testenv.FreeAddr(s.t)
	s.start(name, "outbox-relay", "http://"+addr+"/readyz", nil, "ADMIN_ADDR="+addr, "RELAY_ID="+name)
	return "http://" + addr
}

// startConsumer starts an order-consumer and returns its admin address.
func (s *system) startConsumer(name string) string {
	addr := testenv.FreeAddr(s.t)
	s.start(name, "order-consumer", "http://"+addr+"/readyz", nil, "ADMIN_ADDR="+addr)
	s.admin[name] = "http://" + addr
	return "http://" + addr
}

// output is what process name has printed so far.
func (s *system) output(name string) string {
	p := s.procs[name]
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.log.String()
}

// waitStatus waits until order id has status.
func (s *system) waitStatus(id, status string) {
	s.t.Helper()
	conn, err := pgx.Connect(context.Background(), s.dbURL)
	if err != nil {
		s.t.Fatal(err)
	}
	defer conn.Close(context.Background())
	testenv.WaitFor(s.t, 30*time.Second, "order "+id+" to be "+status, func() bool {
		var got string
		_ = conn.QueryRow(context.Background(), "SELECT status FROM orders WHERE order_id = $1", id).Scan(&got)
		return got == status
	})
}

// publishRaw publishes msg to the events exchange, routed by its type (and
// by its partition header, partition 0 when it has none: the partition
// exchanges route by it, a work queue's binding ignores it).
func (s *system) publishRaw(msg amqp.Publishing) {
	s.t.Helper()
	if _, ok := msg.Headers[outbox.HeaderPartition]; !ok {
		msg.Headers = maps.Clone(msg.Headers)
		if msg.Headers == nil {
			msg.Headers = amqp.Table{}
		}
		msg.Headers[outbox.HeaderPartition] = int32(0)
	}
	conn, err := amqp.Dial(s.amqpURL)
	if err != nil {
		s.t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		s.t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		s.t.Fatal(err)
	}
	dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "orders.events", msg.Type, false, false, msg)
	if err != nil || !dc.Wait() {
		s.t.Fatalf("publish: %v", err)
	}
}

// kill ends a process at once (SIGKILL): no shutdown, no acks, no marks.
func (s *system) kill(name string) {
	s.t.Helper()
	p := s.procs[name]
	_ = p.cmd.Process.Kill()
	s.t.Logf("%s: %v", name, <-p.done) // "signal: killed"
	delete(s.procs, name)
}

// stop ends a process gracefully (SIGTERM) and checks it exits cleanly.
func (s *system) stop(name string) {
	s.t.Helper()
	p := s.procs[name]
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.done:
		if err != nil {
			p.mu.Lock()
			defer p.mu.Unlock()
			s.t.Errorf("%s exited with %v after SIGTERM\n%s", name, err, tail(p.log.String(), 2048))
		}
	case <-time.After(20 * time.Second):
		s.t.Errorf("%s did not stop within 20s of SIGTERM", name)
	}
	delete(s.procs, name)
}

func (s *system) post(path string, body any) (int, map[string]any) {
	s.t.Helper()
	return s.postWithKey(path, "", body)
}

// postWithKey posts body as JSON, with an Idempotency-Key when key is set.
func (s *system) postWithKey(path, key string, body any) (int, map[string]any) {
	s.t.Helper()
	var r io.Reader = http.NoBody
	if body != nil {
		b, _ := json.Marshal(body)
		r = bytes.NewReader(b)
	}
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, s.apiURL+path, r)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+s.token)
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		s.t.Error(err)
		return 0, nil
	}
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out
}

type placed struct {
	id         string
	oos        bool
	cancel     bool
	cancelCode int
}

// 200 orders through the three binaries as processes and the API: some
// with out-of-stock skus, some cancelled on the way, while a consumer and
// a relay are killed (SIGKILL) and restarted mid-run. The kills land in
// the windows they are for, and the test checks that they did: the relay
// dies holding claims (rows PUBLISHING under its claims, published into a
// stalled connection and never confirmed), the consumer dies between the
// two steps of webhook calls (inbox rows PROCESSING) with deliveries
// unacknowledged (its successor sees them redelivered). Every order ends
// in the status its story calls for, with exactly one transition per
// step, and every message is processed.
func TestTwoHundredOrdersThroughTheProcesses(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		time.Sleep(300 * time.Millisecond) // slow: calls are in flight when the consumer dies
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(hook.Close)
	s.env = append(s.env, "NOTIFY_WEBHOOK_URL="+hook.URL)
	relayBroker := testenv.NewProxy(t, testenv.HostPort(s.amqpURL))
	s.startAPI()
	s.startConsumer("consumer-1")
	// relay-1's broker connection goes through a proxy the test stalls, so
	// that it holds unconfirmed claims (for RELAY_CONFIRM_TIMEOUT) when it
	// is killed.
	relay1 := testenv.FreeAddr(t)
	s.start("relay-1", "outbox-relay", "http://"+relay1+"/readyz", nil, "ADMIN_ADDR="+relay1, "RELAY_ID=relay-1",
		"AMQP_URL="+relayBroker.Rewrite(s.amqpURL), "RELAY_CONFIRM_TIMEOUT=25s")
	s.startRelay("relay-2")

	conn, err := pgx.Connect(context.Background(), s.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	count := func(query string) int {
		var n int
		if err := conn.QueryRow(context.Background(), query).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	const relay1Claims = "SELECT count(*) FROM message_outbox WHERE status = 'PUBLISHING' AND claimed_by LIKE 'relay-1/%'"
	const processing = "SELECT count(*) FROM message_inbox WHERE status = 'PROCESSING'"

	const n = 200
	orders := make([]*placed, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for i := range n {
		o := &placed{oos: i%5 == 1, cancel: i%5 == 2 || i%10 == 3}
		orders[i] = o
		if i == n/4 {
			relayBroker.Stall() // relay-1's publishes get no confirm from here on
		}
		if i == n/2 {
			// Halfway, with orders still coming: kill a consumer and a relay
			// without warning, inside their windows, and start others.
			// Claims, unacked deliveries and PROCESSING rows must all come
			// back.
			testenv.WaitFor(t, 20*time.Second, "relay-1 to hold claims and consumer-1 webhook calls", func() bool {
				return count(relay1Claims) > 0 && count(processing) > 0
			})
			s.kill("consumer-1")
			s.kill("relay-1")
			// Dead, they can mark nothing: what they held is still theirs.
			if claims, held := count(relay1Claims), count(processing); claims == 0 || held == 0 {
				t.Fatalf("the kills missed their windows: relay-1 held %d claims, consumer-1 left %d rows PROCESSING", claims, held)
			}
			s.startConsumer("consumer-2")
			s.startRelay("relay-3")
		}
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			sku := "A-1"
			if o.oos {
				sku = "OOS-1"
			}
			code, body := s.post("/v1/orders", map[string]any{"customer_id": fmt.Sprint("c-", i), "currency": "EUR",
				"items": []map[string]any{{"sku": sku, "quantity": 1, "unit_price_cents": 500}}})
			if code != http.StatusCreated {
				t.Errorf("create: %d", code)
				return
			}
			o.id = body["order_id"].(string)
			if o.cancel {
				// Early cancels race the first hops; late ones mostly find the
				// order final (409).
				delay := time.Duration(rand.IntN(30)) * time.Millisecond
				if i%10 == 3 {
					delay = time.Duration(150+rand.IntN(300)) * time.Millisecond
				}
				time.Sleep(delay)
				o.cancelCode, _ = s.post("/v1/orders/"+o.id+"/cancel", nil)
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	// consumer-1's unacknowledged deliveries came back to its successor.
	testenv.WaitFor(t, 30*time.Second, "consumer-2 to get consumer-1's deliveries again", func() bool {
		return sumMetric(scrape(t, s.admin["consumer-2"]), "consumer_messages_redelivered_total") > 0
	})

	status := func(id string) string {
		var st string
		_ = conn.QueryRow(context.Background(), "SELECT status FROM orders WHERE order_id = $1", id).Scan(&st)
		return st
	}
	deadline := time.Now().Add(90 * time.Second)
	for _, o := range orders {
		for st := status(o.id); st != "FULFILLED" && st != "REJECTED" && st != "CANCELLED"; st = status(o.id) {
			if time.Now().After(deadline) {
				t.Fatalf("order %s stuck in %s", o.id, st)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}

	tally := map[string]int{}
	for _, o := range orders {
		final := status(o.id)
		tally[final]++
		want := "FULFILLED"
		if o.oos {
			want = "REJECTED"
		}
		if o.cancel && o.cancelCode == http.StatusOK {
			want = "CANCELLED"
		} else if o.cancel && o.cancelCode != http.StatusConflict {
			t.Errorf("order %s: cancel answered %d", o.id, o.cancelCode)
		}
		if final != want {
			t.Errorf("order %s (oos %v, cancel %v -> %d) is %s, want %s", o.id, o.oos, o.cancel, o.cancelCode, final, want)
		}
		rows, err := conn.Query(context.Background(), "SELECT coalesce(from_status, '') || '>' || to_status FROM order_state_transition WHERE order_id = $1 ORDER BY transition_id", o.id)
		if err != nil {
			t.Fatal(err)
		}
		history, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		if !validHistory(history, final) {
			t.Errorf("order %s (%s): history %v", o.id, final, history)
		}
	}

	// The ledger is clean: every outbox row published, every inbox row processed.
	var unpublished, duplicates int
	_ = conn.QueryRow(context.Background(), "SELECT count(*) FROM message_outbox WHERE status <> 'PUBLISHED'").Scan(&unpublished)
	deadline = time.Now().Add(30 * time.Second)
	for unpublished > 0 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
		_ = conn.QueryRow(context.Background(), "SELECT count(*) FROM message_outbox WHERE status <> 'PUBLISHED'").Scan(&unpublished)
	}
	// Every order has two notifications, its receipt and its final status,
	// each SENT once. (Every inbox row PROCESSED is not enough to wait
	// for: a message still in its queue has no row yet, and on a busy
	// machine the slow webhook leaves many there.)
	const sentAndProcessed = `SELECT (SELECT count(*) FROM customer_notification WHERE status = 'SENT'),
		(SELECT count(*) FROM customer_notification WHERE status <> 'SENT'),
		(SELECT count(*) FROM message_inbox WHERE status <> 'PROCESSED')`
	var sent, unsent, unprocessed int
	testenv.WaitFor(t, 2*time.Minute, "every order's two notifications SENT and every inbox row PROCESSED (the webhook is slow)", func() bool {
		_ = conn.QueryRow(context.Background(), sentAndProcessed).Scan(&sent, &unsent, &unprocessed)
		return sent >= 2*n && unsent == 0 && unprocessed == 0
	})
	if sent != 2*n {
		t.Errorf("%d notifications SENT, want %d: one receipt and one final status per order", sent, 2*n)
	}
	_ = conn.QueryRow(context.Background(), "SELECT count(*) FROM message_inbox WHERE last_received_at > first_received_at + interval '1 millisecond'").Scan(&duplicates)
	if unpublished != 0 {
		t.Errorf("%d outbox rows not PUBLISHED", unpublished)
	}
	t.Logf("final statuses %v; inbox rows seen more than once (redeliveries absorbed): %d", tally, duplicates)

	for _, name := range []string{"relay-2", "relay-3", "consumer-2", "order-api"} {
		s.stop(name)
	}
}

// validHistory checks that a history is a path of the state machine, one
// transition per step, ending in final.
func validHistory(history []string, final string) bool {
	paths := map[string][]string{
		"FULFILLED": {">SUBMITTED", "SUBMITTED>FULFILLMENT_REQUESTED", "FULFILLMENT_REQUESTED>FULFILLED"},
		"REJECTED":  {">SUBMITTED", "SUBMITTED>FULFILLMENT_REQUESTED", "FULFILLMENT_REQUESTED>REJECTED"},
	}
	if want, ok := paths[final]; ok {
		return strings.Join(history, " ") == strings.Join(want, " ")
	}
	// CANCELLED: from SUBMITTED, or after the fulfillment request.
	h := strings.Join(history, " ")
	return h == ">SUBMITTED SUBMITTED>CANCELLED" ||
		h == ">SUBMITTED SUBMITTED>FULFILLMENT_REQUESTED FULFILLMENT_REQUESTED>CANCELLED"
}
