package httpapi_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/yourorg/orders/internal/auth"
	"github.com/yourorg/orders/internal/httpapi"
	"github.com/yourorg/orders/internal/testenv"
)

// overloaded checks that r is the 503 of a server at its limit.
func overloaded(t *testing.T, what string, r response) {
	t.Helper()
	if r.status != http.StatusServiceUnavailable {
		t.Fatalf("%s: %d %s, want 503", what, r.status, r.body)
	}
	if p := r.problem(t); p.Code != "overloaded" {
		t.Fatalf("%s: code %q, want overloaded", what, p.Code)
	}
	if got := r.header.Get("Retry-After"); got == "" {
		t.Fatalf("%s: no Retry-After", what)
	}
}

// warm opens n connections of pool and returns them to it idle, so that
// a short acquire timeout measures waiting for a free connection, not
// dialling one on a loaded machine.
func warm(t *testing.T, pool *pgxpool.Pool, n int) {
	t.Helper()
	var conns []*pgxpool.Conn
	for range n {
		c, err := pool.Acquire(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Release()
	}
}

// With every connection of the API's pool held by open transactions, a
// request gets a 503 with Retry-After, instead of waiting for a connection
// as long as its client does; it writes nothing. Once the connections are
// free, the same request succeeds.
func TestPoolExhaustedAnswers503(t *testing.T) {
	t.Parallel()
	var apiPool *pgxpool.Pool
	b := setupWith(t, func(cfg *httpapi.Config, d *httpapi.Deps) {
		pcfg := d.Pool.Config()
		pcfg.MaxConns = 2
		var err error
		if apiPool, err = pgxpool.NewWithConfig(t.Context(), pcfg); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(apiPool.Close)
		warm(t, apiPool, 2)
		d.Pool = apiPool
		cfg.AcquireTimeout = 100 * time.Millisecond
	})
	existing := b.createOrder(validOrder, nil)

	// Hold both connections in open transactions.
	for range 2 {
		tx, err := apiPool.Begin(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		// Before apiPool.Close (cleanups run last first), which waits for it.
		t.Cleanup(func() { _ = tx.Rollback(context.WithoutCancel(t.Context())) })
	}
	overloaded(t, "POST /v1/orders", b.do(http.MethodPost, "/v1/orders", []byte(validOrder), nil))
	overloaded(t, "GET /v1/orders", b.do(http.MethodGet, "/v1/orders", nil, nil))
	overloaded(t, "GET /v1/orders/{id}", b.do(http.MethodGet, "/v1/orders/"+existing.OrderID, nil, nil))
	overloaded(t, "POST /v1/orders/{id}/cancel", b.do(http.MethodPost, "/v1/orders/"+existing.OrderID+"/cancel", nil, nil))
	if r := b.do(http.MethodGet, "/healthz", nil, nil); r.status != http.StatusOK {
		t.Fatalf("healthz while the pool is busy: %d", r.status)
	}
	if n, m := b.count("orders"), b.count("message_outbox"); n != 1 || m != 1 {
		t.Fatalf("%d orders, %d outbox rows; want the first order's 1 and 1", n, m)
	}
	if s := apiPool.Stat(); s.AcquiredConns() != 2 {
		t.Fatalf("%d connections acquired, want the 2 the test holds", s.AcquiredConns())
	}
}

// The pool's connections come back: a request after the 503s succeeds.
func TestPoolFreeAgainAfter503(t *testing.T) {
	t.Parallel()
	var apiPool *pgxpool.Pool
	b := setupWith(t, func(cfg *httpapi.Config, d *httpapi.Deps) {
		pcfg := d.Pool.Config()
		pcfg.MaxConns = 1
		var err error
		if apiPool, err = pgxpool.NewWithConfig(t.Context(), pcfg); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(apiPool.Close)
		d.Pool = apiPool
		cfg.AcquireTimeout = 100 * time.Millisecond
	})
	tx, err := apiPool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	// Before apiPool.Close (cleanups run last first), which waits for it.
	t.Cleanup(func() { _ = tx.Rollback(context.WithoutCancel(t.Context())) })
	overloaded(t, "POST /v1/orders", b.do(http.MethodPost, "/v1/orders", []byte(validOrder), nil))
	if err := tx.Rollback(t.Context()); err != nil {
		t.Fatal(err)
	}
	for range 3 { // each request gives its connection back
		b.createOrder(validOrder, nil)
	}
	if s := apiPool.Stat(); s.AcquiredConns() != 0 {
		t.Fatalf("%d connections still acquired after the requests", s.AcquiredConns())
	}
}

// With MaxInFlight requests being handled, one more gets a 503 with
// Retry-After at once; the probes still answer; the held request finishes,
// and its slot is free again.
func TestInFlightCapAnswers503(t *testing.T) {
	t.Parallel()
	b := setupWith(t, func(cfg *httpapi.Config, _ *httpapi.Deps) { cfg.MaxInFlight = 1 })
	o := b.createOrder(validOrder, nil)

	// Hold a cancel in flight: it waits for the lock on the order's row.
	lock, held := b.cancelBehindLock(o.OrderID)

	overloaded(t, "GET /v1/orders with one in flight", b.do(http.MethodGet, "/v1/orders", nil, nil))
	overloaded(t, "POST /v1/orders with one in flight", b.do(http.MethodPost, "/v1/orders", []byte(validOrder), nil))
	for _, path := range []string{"/healthz", "/readyz"} {
		if r := b.do(http.MethodGet, path, nil, nil); r.status != http.StatusOK {
			t.Errorf("%s with one in flight: %d %s", path, r.status, r.body)
		}
	}

	if err := lock.Rollback(t.Context()); err != nil {
		t.Fatal(err)
	}
	if r := <-held; r.status != http.StatusOK || !strings.Contains(string(r.body), `"CANCELLED"`) {
		t.Fatalf("the held cancel: %d %s", r.status, r.body)
	}
	if r := b.do(http.MethodGet, "/v1/orders", nil, nil); r.status != http.StatusOK {
		t.Fatalf("GET /v1/orders after the held request finished: %d %s", r.status, r.body)
	}
	if n := b.count("orders"); n != 1 {
		t.Fatalf("%d orders: a refused request wrote one", n)
	}
}

// Once shutdown starts, /readyz answers 503 while a request in flight
// finishes and new requests are still served.
func TestNotReadyOnceShutdownStarts(t *testing.T) {
	t.Parallel()
	shuttingDown := make(chan struct{})
	b := setupWith(t, func(_ *httpapi.Config, d *httpapi.Deps) { d.ShuttingDown = shuttingDown })
	o := b.createOrder(validOrder, nil)
	if r := b.do(http.MethodGet, "/readyz", nil, nil); r.status != http.StatusOK || r.closed {
		t.Fatalf("readyz before shutdown: %d %v %s, want 200 on a connection kept alive", r.status, r.header, r.body)
	}

	lock, held := b.cancelBehindLock(o.OrderID)

	close(shuttingDown)
	r := b.do(http.MethodGet, "/readyz", nil, nil)
	if r.status != http.StatusServiceUnavailable || r.problem(t).Code != "shutting_down" || r.header.Get("Retry-After") == "" {
		t.Fatalf("readyz once shutdown started: %d %v %s", r.status, r.header, r.body)
	}
	// Every answer now closes its connection: the client's next request
	// goes on a new one, never on one the server is about to close.
	if r := b.do(http.MethodGet, "/v1/orders/"+o.OrderID, nil, nil); r.status != http.StatusOK || !r.closed {
		t.Fatalf("GET an order while draining: %d %v %s, want 200 with Connection: close", r.status, r.header, r.body)
	}
	if err := lock.Rollback(t.Context()); err != nil {
		t.Fatal(err)
	}
	if r := <-held; r.status != http.StatusOK || !r.closed {
		t.Fatalf("the request in flight: %d %v %s, want 200 with Connection: close", r.status, r.header, r.body)
	}
}

// cancelBehindLock holds a request in flight: it locks the order's row in
// a transaction of its own, sends the cancel of the order, and returns once
// the cancel waits for the lock. Rolling lock back lets the cancel finish;
// its response then arrives on the channel.
func (b *testBundle) cancelBehindLock(orderID string) (pgx.Tx, <-chan response) {
	t := b.t
	t.Helper()
	lock, err := b.pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lock.Rollback(context.WithoutCancel(t.Context())) })
	if _, err := lock.Exec(t.Context(), "SELECT 1 FROM orders WHERE order_id = $1 FOR UPDATE", orderID); err != nil {
		t.Fatal(err)
	}
	held := make(chan response, 1)
	token := b.token("operator-1", auth.RoleOperator)
	go func() {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, b.server.URL+"/v1/orders/"+orderID+"/cancel", nil)
		if err != nil {
			t.Error(err)
			held <- response{}
			return
		}
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := b.client.Do(req)
		if err != nil {
			t.Errorf("the cancel held behind the lock: %v", err)
			held <- response{}
			return
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		held <- response{status: resp.StatusCode, header: resp.Header, body: body, closed: resp.Close}
	}()
	testenv.WaitFor(t, 30*time.Second, "the cancel to wait for the row lock", func() bool {
		var waiting int
		err := b.pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting)
		return err == nil && waiting == 1
	})
	return lock, held
}
