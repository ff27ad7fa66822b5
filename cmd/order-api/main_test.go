package main

import (
	"bytes"
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/yourorg/orders/internal/config"
	"github.com/yourorg/orders/internal/testenv"
)

// `order-api migrate` creates the database when the server has none, and
// applies every migration; `migrate status` then shows them applied.
func TestMigrateCreatesDatabase(t *testing.T) {
	t.Parallel()
	name := testenv.TestDatabaseName()
	testenv.DropDatabaseAtCleanup(t, name)
	environ := map[string]string{"DATABASE_URL": testenv.ServerURL(t, name), "LOG_FORMAT": "text"}

	var out bytes.Buffer
	if err := run(t.Context(), []string{"migrate"}, environ, &out, &out); err != nil {
		t.Fatalf("migrate: %v\n%s", err, out.String())
	}
	out.Reset()
	if err := run(t.Context(), []string{"migrate", "status"}, environ, &out, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "00001_orders.sql") || strings.Contains(out.String(), "pending") {
		t.Fatalf("status after migrate:\n%s", out.String())
	}
	if err := run(t.Context(), []string{"migrate", "sideways"}, environ, &out, &out); err == nil {
		t.Fatal("migrate sideways: want an error")
	}
}

func TestBadConfigurationFailsStartup(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	err := run(t.Context(), nil, map[string]string{"IDEMPOTENCY_KEY_TTL": "-1s", "LOG_LEVEL": "loud"}, &out, &out)
	if err == nil || !strings.Contains(err.Error(), "IDEMPOTENCY_KEY_TTL") || !strings.Contains(err.Error(), "LOG_LEVEL") {
		t.Fatalf("err = %v; want both bad variables named", err)
	}
}

// JAEGER_UI_URL is where the timeline page links traces: a value that is
// no http(s) URL stops the start, naming the variable.
func TestBadJaegerUIURLFailsStartup(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{"localhost:16686", "ftp://jaeger", "http://"} {
		var out bytes.Buffer
		err := run(t.Context(), nil, map[string]string{"JAEGER_UI_URL": bad}, &out, &out)
		if err == nil || !strings.Contains(err.Error(), "JAEGER_UI_URL") {
			t.Errorf("JAEGER_UI_URL=%s: err = %v; want it named", bad, err)
		}
	}
}

// The process serves with -migrate on an empty database, and on cancel
// (SIGTERM) drains and returns without error.
func TestServeAndShutDown(t *testing.T) {
	t.Parallel()
	name := testenv.TestDatabaseName()
	testenv.DropDatabaseAtCleanup(t, name)
	addr := testenv.FreeAddr(t)
	environ := map[string]string{"DATABASE_URL": testenv.ServerURL(t, name), "HTTP_ADDR": addr}

	ctx, cancel := context.WithCancel(t.Context())
	var (
		wg     sync.WaitGroup
		runErr error
		logs   syncBuffer
	)
	wg.Go(func() { runErr = run(ctx, []string{"-migrate"}, environ, &logs, &logs) })

	base := "http://" + addr
	testenv.WaitOK(t, 20*time.Second, base+"/readyz")
	resp, err := http.Post(base+"/v1/orders", "application/json",
		strings.NewReader(`{"customer_id":"c","currency":"EUR","items":[{"sku":"A","quantity":1,"unit_price_cents":1}]}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("POST /v1/orders: %d", resp.StatusCode)
	}
	cancel()
	wg.Wait()
	if runErr != nil {
		t.Fatalf("run: %v\n%s", runErr, logs.String())
	}
	conn, err := pgx.Connect(t.Context(), environ["DATABASE_URL"])
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(t.Context())
	var n int
	if err := conn.QueryRow(t.Context(), "SELECT count(*) FROM message_outbox").Scan(&n); err != nil || n != 1 {
		t.Fatalf("outbox rows: %d, %v", n, err)
	}
	if !strings.Contains(logs.String(), `"msg":"starting"`) || strings.Contains(logs.String(), "hunter") {
		t.Fatalf("logs:\n%s", logs.String())
	}
}

// The overload and shutdown settings are checked at start, each error
// naming its variable.
func TestBadOverloadSettingsFailStartup(t *testing.T) {
	t.Parallel()
	for variable, value := range map[string]string{
		"DB_ACQUIRE_TIMEOUT": "0s",
		"HTTP_MAX_IN_FLIGHT": "0",
		"SHUTDOWN_DELAY":     "-1s",
	} {
		// Should the setting be let through, run finds no database (and
		// would listen on a free port, never on :8080).
		environ := map[string]string{variable: value, "HTTP_ADDR": testenv.FreeAddr(t),
			"DATABASE_URL": testenv.ServerURL(t, testenv.TestDatabaseName())}
		var out bytes.Buffer
		err := run(t.Context(), nil, environ, &out, &out)
		if err == nil || !strings.Contains(err.Error(), variable) {
			t.Errorf("%s=%s: err = %v; want it to name %s", variable, value, err, variable)
		}
	}
}

// On SIGTERM, /readyz answers 503 at once while the API goes on serving
// for SHUTDOWN_DELAY (a load balancer takes it out of rotation meanwhile);
// then it drains and run returns without error.
func TestNotReadyDuringShutdownDelay(t *testing.T) {
	t.Parallel()
	name := testenv.TestDatabaseName()
	testenv.DropDatabaseAtCleanup(t, name)
	addr := testenv.FreeAddr(t)
	environ := map[string]string{"DATABASE_URL": testenv.ServerURL(t, name), "HTTP_ADDR": addr, "SHUTDOWN_DELAY": "5s"}

	ctx, cancel := context.WithCancel(t.Context())
	var (
		wg     sync.WaitGroup
		runErr error
		logs   syncBuffer
	)
	wg.Go(func() { runErr = run(ctx, []string{"-migrate"}, environ, &logs, &logs) })
	base := "http://" + addr
	testenv.WaitOK(t, 20*time.Second, base+"/readyz")

	cancel() // SIGTERM
	var status int
	testenv.WaitFor(t, 5*time.Second, "/readyz to answer 503 after SIGTERM", func() bool {
		resp, err := http.Get(base + "/readyz")
		if err != nil {
			t.Fatalf("GET /readyz after SIGTERM: %v (the API stopped serving at once)", err)
		}
		resp.Body.Close()
		status = resp.StatusCode
		return status != http.StatusOK
	})
	if status != http.StatusServiceUnavailable {
		t.Fatalf("/readyz after SIGTERM: %d, want 503", status)
	}
	resp, err := http.Post(base+"/v1/orders", "application/json",
		strings.NewReader(`{"customer_id":"c","currency":"EUR","items":[{"sku":"A","quantity":1,"unit_price_cents":1}]}`))
	if err != nil {
		t.Fatalf("POST /v1/orders while not ready: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("POST /v1/orders while not ready: %d, want it still served", resp.StatusCode)
	}
	wg.Wait()
	if runErr != nil {
		t.Fatalf("run: %v\n%s", runErr, logs.String())
	}
}

// Every variable order-api reads is documented in the README.
func TestREADMEDocumentsEveryVariable(t *testing.T) {
	t.Parallel()
	testenv.READMEDocuments(t, config.Variables(&Config{}))
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// docker-compose.yml gives order-api only variables it reads: a variable it
// does not read is a setting that silently does nothing.
func TestComposeSetsOnlyVariablesItReads(t *testing.T) {
	t.Parallel()
	testenv.ComposeSetsOnly(t, "order-api", config.Variables(&Config{}))
}
