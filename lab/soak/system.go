package main

import (
	"context"
	cryptorand "crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"sync"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/yourorg/orders/internal/auth"
	"github.com/yourorg/orders/internal/messaging/inbox"
	"github.com/yourorg/orders/internal/messaging/inbox/inboxadmin"
	"github.com/yourorg/orders/internal/messaging/outbox/outboxadmin"
	"github.com/yourorg/orders/lab/sandbox"
)

// system is the flow the soak runs: the processes, the proxies in front of
// the servers for the relays and the consumer, and the webhook.
type system struct {
	dir       string // the binaries, and the logs
	serverURL string // the PostgreSQL server (any database)
	dbName    string
	dbURL     string // the run's database, direct
	amqpURL   string // the run's vhost, direct
	apiURL    string
	apiToken  string   // an operator's token for order-api
	relayEnv  []string // the relays' RELAY_MODE and its settings
	logf      func(string, ...any)

	pgProxy, mqProxy *toxiproxy.Proxy
	hook             *webhook
	hookServer       *http.Server

	mu    sync.Mutex
	procs map[string]*sandbox.Process // by name
	ctx   context.Context             // the processes run until it ends
	stop  context.CancelFunc
}

// The settings of the processes: short enough that the run's faults heal
// within the run (a lease of 15s, not 30s), otherwise the defaults.
var processEnv = []string{
	"LOG_FORMAT=json",
	"RELAY_LEASE=15s", "RELAY_CONFIRM_TIMEOUT=5s", "RELAY_DB_TIMEOUT=5s", "RELAY_BACKOFF_MAX=10s",
	"CONSUMER_RETRY_DELAYS=1s,5s,15s", "CONSUMER_TX_TIMEOUT=5s", "CONSUMER_PROCESSING_LEASE=10s",
	"NOTIFY_WEBHOOK_TIMEOUT=1s", "SHUTDOWN_TIMEOUT=5s",
}

// The processes the soak runs, and which of them the chaos may kill.
var (
	relays   = []string{"outbox-relay-1", "outbox-relay-2"}
	killable = append([]string{"order-consumer"}, relays...)
)

func startSystem(ctx context.Context, dir, serverURL, dbName, dbURL, amqpURL string, relayEnv []string, logf func(string, ...any)) (*system, error) {
	s := &system{dir: dir, serverURL: serverURL, dbName: dbName, dbURL: dbURL, amqpURL: amqpURL, relayEnv: relayEnv, logf: logf,
		procs: map[string]*sandbox.Process{}, hook: &webhook{keys: map[string]int{}, notes: map[string]map[string]bool{}}}
	s.ctx, s.stop = context.WithCancel(ctx)
	var err error
	if s.pgProxy, err = newProxy("postgres", dbURL); err != nil {
		return s, err
	}
	if s.mqProxy, err = newProxy("rabbitmq", amqpURL); err != nil {
		return s, err
	}
	hookAddr, err := sandbox.FreeAddr(ctx)
	if err != nil {
		return s, err
	}
	s.hookServer = &http.Server{Addr: hookAddr, Handler: s.hook, ReadHeaderTimeout: 5 * time.Second}
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", hookAddr)
	if err != nil {
		return s, err
	}
	go func() { _ = s.hookServer.Serve(ln) }()

	// The consumer first: it declares the queues the relays publish to.
	for _, name := range append([]string{"order-consumer"}, relays...) {
		if err := s.start(name); err != nil {
			return s, err
		}
	}
	addr, err := sandbox.FreeAddr(ctx)
	if err != nil {
		return s, err
	}
	s.apiURL = "http://" + addr
	// order-api verifies tokens with a secret of this run.
	secret := cryptorand.Text() + cryptorand.Text()
	if s.apiToken, err = auth.Mint([]byte(secret), auth.Principal{Subject: "soak", Role: auth.RoleOperator}, 24*time.Hour, "", ""); err != nil {
		return s, err
	}
	p, err := sandbox.Start(s.ctx, "order-api", filepath.Join(dir, "order-api"), s.apiURL+"/readyz", dir,
		append(processEnv, "DATABASE_URL="+dbURL, "AMQP_URL="+amqpURL, "HTTP_ADDR="+addr,
			"API_AUTH=jwt", "API_JWT_SECRET="+secret, "API_JWT_PUBLIC_KEYS=", "API_JWT_ISSUER=", "API_JWT_AUDIENCE=")...)
	s.track("order-api", p)
	return s, err
}

// start starts the relay or the consumer called name, behind the proxies,
// and waits until it is ready.
func (s *system) start(name string) error {
	env := append(processEnv, "DATABASE_URL="+rewrite(s.dbURL, s.pgProxy), "AMQP_URL="+rewrite(s.amqpURL, s.mqProxy))
	binary := "order-consumer"
	if name != "order-consumer" {
		binary = "outbox-relay"
		env = append(append(env, "RELAY_ID="+name), s.relayEnv...)
	} else {
		env = append(env, "NOTIFY_WEBHOOK_URL=http://"+s.hookServer.Addr+"/notifications")
	}
	addr, err := sandbox.FreeAddr(s.ctx)
	if err != nil {
		return err
	}
	// Each start logs to a file of its own: a killed process's log stays.
	logName := fmt.Sprintf("%s-%d", name, time.Now().UnixNano())
	p, err := sandbox.Start(s.ctx, logName, filepath.Join(s.dir, binary), "http://"+addr+"/readyz", s.dir,
		append(env, "ADMIN_ADDR="+addr)...)
	if err != nil {
		if p != nil {
			_ = p.Stop()
		}
		return err
	}
	s.track(name, p)
	return nil
}

func (s *system) track(name string, p *sandbox.Process) {
	if p == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.procs[name] = p
}

// kill SIGKILLs the process called name and starts it again.
func (s *system) kill(name string) error {
	s.mu.Lock()
	p := s.procs[name]
	delete(s.procs, name)
	s.mu.Unlock()
	if p != nil {
		_ = p.Kill() // "signal: killed"
	}
	return s.start(name)
}

// close stops the processes (SIGTERM, then SIGKILL after 20s), the
// webhook and the proxies.
func (s *system) close() error {
	s.mu.Lock()
	procs := s.procs
	s.procs = nil
	s.mu.Unlock()
	var errs []error
	if p := procs["order-api"]; p != nil {
		errs = append(errs, p.Stop())
	}
	for _, name := range append(append([]string(nil), relays...), "order-consumer") {
		if p := procs[name]; p != nil {
			errs = append(errs, p.Stop())
		}
	}
	s.stop()
	if s.hookServer != nil {
		_ = s.hookServer.Close()
	}
	for _, p := range []*toxiproxy.Proxy{s.pgProxy, s.mqProxy} {
		if p != nil {
			p.Stop()
		}
	}
	return errors.Join(errs...)
}

// newProxy starts a TCP proxy on a free local port to the server of rawURL.
func newProxy(name, rawURL string) (*toxiproxy.Proxy, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, err
	}
	upstream := u.Host
	if u.Port() == "" {
		port := "5672"
		if u.Scheme == "postgres" || u.Scheme == "postgresql" {
			port = "5432"
		}
		upstream = net.JoinHostPort(u.Hostname(), port)
	}
	server := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	p := toxiproxy.NewProxy(server, "soak-"+name, "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		return nil, fmt.Errorf("proxy to %s: %w", upstream, err)
	}
	return p, nil
}

// rewrite points rawURL at the proxy.
func rewrite(rawURL string, p *toxiproxy.Proxy) string {
	u, _ := url.Parse(rawURL)
	u.Host = p.Listen
	return u.String()
}

// webhook is the receiver of the notifications: it records each
// Idempotency-Key once (a retry of a key seen before is a replay, not a
// new notification), and misbehaves now and then as real receivers do:
// one call in 20 answers 503, one in 50 answers after the consumer's
// timeout (NOTIFY_WEBHOOK_TIMEOUT: the consumer cannot know that it
// arrived).
type webhook struct {
	mu    sync.Mutex
	calls int
	keys  map[string]int             // calls per Idempotency-Key
	notes map[string]map[string]bool // order and kind -> the keys that carried it
}

func (w *webhook) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	var body struct {
		OrderID string `json:"order_id"`
		Kind    string `json:"kind"`
	}
	key := r.Header.Get("Idempotency-Key")
	if err := json.NewDecoder(io.LimitReader(r.Body, 64<<10)).Decode(&body); err != nil || key == "" {
		rw.WriteHeader(http.StatusBadRequest)
		return
	}
	switch n := rand.IntN(100); {
	case n < 5:
		rw.WriteHeader(http.StatusServiceUnavailable)
		return
	case n < 7:
		defer time.Sleep(1500 * time.Millisecond) // recorded, answered too late
	}
	w.mu.Lock()
	w.calls++
	w.keys[key]++
	note := body.OrderID + " " + body.Kind
	if w.notes[note] == nil {
		w.notes[note] = map[string]bool{}
	}
	w.notes[note][key] = true
	w.mu.Unlock()
	rw.WriteHeader(http.StatusOK)
}

// settle waits, the faults healed, until every order is final and
// nothing is in flight (outbox rows waiting, inbox rows between attempts),
// or until timeout; it reports the progress every 10 seconds.
func (s *system) settle(ctx context.Context, timeout time.Duration, logf func(string, ...any)) error {
	conn, err := pgx.Connect(ctx, s.dbURL)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	deadline := time.Now().Add(timeout)
	lastReport := time.Now()
	for {
		var notFinal, outboxBusy, inboxBusy int
		err := conn.QueryRow(ctx, `SELECT count(*) FROM orders WHERE status NOT IN ('FULFILLED', 'REJECTED', 'CANCELLED')`).Scan(&notFinal)
		if err != nil {
			return err
		}
		ostats, err := outboxadmin.Stats(ctx, conn)
		if err != nil {
			return err
		}
		for _, s := range ostats {
			if s.Status == "PENDING" || s.Status == "PUBLISHING" {
				outboxBusy += int(s.Rows)
			}
		}
		istats, err := inboxadmin.Stats(ctx, conn)
		if err != nil {
			return err
		}
		for _, s := range istats {
			if s.Status == inbox.StatusProcessing || s.Status == inbox.StatusRetryableFailed {
				inboxBusy += int(s.Rows)
			}
		}
		if notFinal == 0 && outboxBusy == 0 && inboxBusy == 0 {
			logf("settled: every order final, nothing in flight")
			return nil
		}
		if time.Now().After(deadline) {
			logf("not settled after %s: %d orders not final, %d outbox rows waiting, %d inbox rows between attempts",
				timeout, notFinal, outboxBusy, inboxBusy)
			return nil // the check reports them
		}
		if time.Since(lastReport) > 10*time.Second {
			logf("settling: %d orders not final, %d outbox rows waiting, %d inbox rows between attempts", notFinal, outboxBusy, inboxBusy)
			lastReport = time.Now()
		}
		select {
		case <-ctx.Done():
			return errors.New("interrupted")
		case <-time.After(time.Second):
		}
	}
}
