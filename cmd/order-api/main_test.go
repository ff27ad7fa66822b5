package main

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/yourorg/orders/internal/auth"
	"github.com/yourorg/orders/internal/config"
	"github.com/yourorg/orders/internal/messaging/outbox/outboxadmin"
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
	if !strings.Contains(out.String(), "00001_orders.sql") || strings.Contains(out.String(), " pending\n") {
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

// API_PUBLIC_URL is where clients reach the API: a value that is no
// http(s) URL stops the start; with https, the /ui/ sign-in cookie is
// Secure although the request arrives over plain HTTP (TLS ends in a proxy).
func TestPublicURL(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{"orders.example.com", "ftp://orders.example.com", "https://"} {
		var out bytes.Buffer
		err := run(t.Context(), nil, map[string]string{"API_PUBLIC_URL": bad}, &out, &out)
		if err == nil || !strings.Contains(err.Error(), "API_PUBLIC_URL") {
			t.Errorf("API_PUBLIC_URL=%s: err = %v; want it named", bad, err)
		}
	}
	name := testenv.TestDatabaseName()
	testenv.DropDatabaseAtCleanup(t, name)
	secret := rand.Text() + rand.Text()
	base, stop, _ := serve(t, map[string]string{"DATABASE_URL": testenv.ServerURL(t, name), "API_JWT_SECRET": secret,
		"API_PUBLIC_URL": "HTTPS://orders.example.com"})
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, base+"/ui/login",
		strings.NewReader(url.Values{"token": {mint(t, secret, "c")}}.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	resp, err := http.DefaultTransport.RoundTrip(req) // no redirect
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if cookies := resp.Cookies(); resp.StatusCode != http.StatusSeeOther || len(cookies) != 1 || !cookies[0].Secure {
		t.Errorf("sign-in over plain HTTP with an https API_PUBLIC_URL: %d %v, want a Secure cookie", resp.StatusCode, cookies)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

// The process serves with -migrate on an empty database, and on cancel
// (SIGTERM) drains and returns without error.
func TestServeAndShutDown(t *testing.T) {
	t.Parallel()
	name := testenv.TestDatabaseName()
	testenv.DropDatabaseAtCleanup(t, name)
	secret := "hunter2-" + rand.Text() // never in the logs
	environ := map[string]string{"DATABASE_URL": testenv.ServerURL(t, name), "API_JWT_SECRET": secret}
	base, stop, logs := serve(t, environ)
	if code := postOrder(t, base, ""); code != http.StatusUnauthorized {
		t.Fatalf("POST /v1/orders without a token: %d, want 401", code)
	}
	if code := postOrder(t, base, mint(t, secret, "c")); code != http.StatusCreated {
		t.Fatalf("POST /v1/orders: %d", code)
	}
	if err := stop(); err != nil {
		t.Fatalf("run: %v\n%s", err, logs.String())
	}
	conn, err := pgx.Connect(t.Context(), environ["DATABASE_URL"])
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(t.Context())
	if backlog, err := outboxadmin.Stats(t.Context(), conn); err != nil || len(backlog) != 1 || backlog[0].Status != "PENDING" || backlog[0].Rows != 1 {
		t.Fatalf("outbox rows not published: %+v, %v; want 1 PENDING", backlog, err)
	}
	if !strings.Contains(logs.String(), `"msg":"starting"`) || strings.Contains(logs.String(), "hunter") {
		t.Fatalf("logs:\n%s", logs.String())
	}
}

// A graceful restart cuts no request. Eight clients post orders on
// keep-alive connections, one after another as fast as they are answered;
// then SIGTERM. Every request is answered (201) or refused at connect,
// never reset or ended with EOF under the client, which could not tell
// whether its order was created; and every order in the database was
// answered. Each round is a start and a SIGTERM of the process; three
// rounds, for a race that needs a client to send just as its connection
// closes.
func TestShutdownCutsNoRequest(t *testing.T) {
	t.Parallel()
	name := testenv.TestDatabaseName()
	testenv.DropDatabaseAtCleanup(t, name)
	secret := rand.Text() + rand.Text()
	token := mint(t, secret, "c")
	var answered atomic.Int64
	for round := range 3 {
		base, stop, logs := serve(t, map[string]string{"DATABASE_URL": testenv.ServerURL(t, name), "API_JWT_SECRET": secret})
		var (
			wg              sync.WaitGroup
			refused, before atomic.Int64
			mu              sync.Mutex
			cut             []string
		)
		before.Store(answered.Load())
		for range 8 {
			wg.Go(func() {
				transport := &http.Transport{MaxIdleConnsPerHost: 1}
				defer transport.CloseIdleConnections()
				client := &http.Client{Transport: transport, Timeout: 30 * time.Second}
				for {
					req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, base+"/v1/orders",
						strings.NewReader(`{"customer_id":"c","currency":"EUR","items":[{"sku":"A","quantity":1,"unit_price_cents":1}]}`))
					if err != nil {
						t.Error(err)
						return
					}
					req.Header.Set("Content-Type", "application/json")
					req.Header.Set("Authorization", "Bearer "+token)
					resp, err := client.Do(req)
					var opErr *net.OpError
					switch {
					case errors.As(err, &opErr) && opErr.Op == "dial":
						refused.Add(1) // the server is gone: refused at connect
						return
					case err != nil:
						mu.Lock()
						cut = append(cut, err.Error())
						mu.Unlock()
						return
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusCreated {
						t.Errorf("POST /v1/orders: %d", resp.StatusCode)
						return
					}
					answered.Add(1)
				}
			})
		}
		testenv.WaitFor(t, 20*time.Second, "the clients' first orders", func() bool { return answered.Load() > before.Load()+100 })
		if err := stop(); err != nil { // SIGTERM; returns when run has
			t.Fatalf("run: %v\n%s", err, logs.String())
		}
		wg.Wait()
		for _, err := range cut {
			t.Errorf("round %d: a request cut at shutdown: %s", round+1, err)
		}
		if refused.Load() != 8-int64(len(cut)) {
			t.Errorf("round %d: %d clients refused at connect, want the %d not cut", round+1, refused.Load(), 8-len(cut))
		}
	}
	conn, err := pgx.Connect(t.Context(), testenv.ServerURL(t, name))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(t.Context())
	var orders int64
	if err := conn.QueryRow(t.Context(), "SELECT count(*) FROM orders").Scan(&orders); err != nil || orders != answered.Load() {
		t.Fatalf("%d orders (%v) for %d answered: an order was created whose answer never came", orders, err, answered.Load())
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
	secret := rand.Text() + rand.Text()
	environ := map[string]string{"DATABASE_URL": testenv.ServerURL(t, name), "HTTP_ADDR": addr, "SHUTDOWN_DELAY": "5s",
		"API_JWT_SECRET": secret}

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
	if code := postOrder(t, base, mint(t, secret, "c")); code != http.StatusCreated {
		t.Fatalf("POST /v1/orders while not ready: %d, want it still served", code)
	}
	wg.Wait()
	if runErr != nil {
		t.Fatalf("run: %v\n%s", runErr, logs.String())
	}
}

// mint is a token of customer for the API of secret.
func mint(t *testing.T, secret, customer string) string {
	t.Helper()
	token, err := auth.Mint([]byte(secret), auth.Principal{Subject: customer, Role: auth.RoleCustomer}, time.Hour, "", "")
	if err != nil {
		t.Fatal(err)
	}
	return token
}

// postOrder creates an order of customer "c" with token (none when "")
// and returns the status.
func postOrder(t *testing.T, base, token string) int {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, base+"/v1/orders",
		strings.NewReader(`{"customer_id":"c","currency":"EUR","items":[{"sku":"A","quantity":1,"unit_price_cents":1}]}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST /v1/orders: %v", err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// The authentication settings are checked at start, each error naming its
// variable: jwt (the default) with no key, a short secret, an unreadable
// or keyless public keys file, public keys without an audience, an
// unknown mode.
func TestBadAuthSettingsFailStartup(t *testing.T) {
	t.Parallel()
	notPEM := filepath.Join(t.TempDir(), "keys.pem")
	if err := os.WriteFile(notPEM, []byte("not a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	public, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKIXPublicKey(public)
	if err != nil {
		t.Fatal(err)
	}
	idpKeys := filepath.Join(t.TempDir(), "idp.pem")
	if err := os.WriteFile(idpKeys, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		environ map[string]string
		want    string
	}{
		{map[string]string{}, "API_AUTH=jwt needs API_JWT_SECRET or API_JWT_PUBLIC_KEYS"},
		{map[string]string{"API_JWT_SECRET": "too-short"}, "API_JWT_SECRET is 9 bytes, want at least 32"},
		{map[string]string{"API_JWT_PUBLIC_KEYS": filepath.Join(t.TempDir(), "missing.pem")}, "API_JWT_PUBLIC_KEYS: open"},
		{map[string]string{"API_JWT_PUBLIC_KEYS": notPEM}, "API_JWT_PUBLIC_KEYS " + notPEM + ": no PEM block"},
		{map[string]string{"API_AUTH": "none"}, `API_AUTH "none": want jwt or off`},
		// An identity provider's keys verify the tokens of all its clients.
		{map[string]string{"API_JWT_PUBLIC_KEYS": idpKeys}, "API_JWT_PUBLIC_KEYS needs API_JWT_AUDIENCE"},
	} {
		// Should the setting be let through, run finds no database.
		tc.environ["HTTP_ADDR"] = testenv.FreeAddr(t)
		tc.environ["DATABASE_URL"] = testenv.ServerURL(t, testenv.TestDatabaseName())
		var out bytes.Buffer
		err := run(t.Context(), nil, tc.environ, &out, &out)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err = %v; want %q", tc.environ, err, tc.want)
		}
	}
}

// The development JWT secret is public, in the repository: with it anyone
// mints an operator's token. order-api refuses to start with it, or with
// a development password in DATABASE_URL, unless told it runs in
// development, which it then says with a WARN line at start. A secret may
// come from a file (API_JWT_SECRET_FILE, DATABASE_PASSWORD_FILE: docker
// compose's generated secrets); the file's is checked the same.
func TestDevelopmentCredentialsOnlyInDevelopment(t *testing.T) {
	t.Parallel()
	devSecretFile := filepath.Join(t.TempDir(), "api-jwt-secret")
	if err := os.WriteFile(devSecretFile, []byte(config.DevelopmentJWTSecret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		environ map[string]string
		want    string
	}{
		"the development secret":           {map[string]string{"API_JWT_SECRET": config.DevelopmentJWTSecret}, "API_JWT_SECRET is a development credential"},
		"the development secret in a file": {map[string]string{"API_JWT_SECRET_FILE": devSecretFile}, "API_JWT_SECRET is a development credential"},
		"a development database password": {map[string]string{"API_JWT_SECRET": rand.Text() + rand.Text(),
			"DATABASE_URL": "postgres://orders_api:api-dev@127.0.0.1:1/orders"}, "DATABASE_URL carries a development password"},
	} {
		// Should the setting be let through, run finds no database.
		tc.environ["HTTP_ADDR"] = testenv.FreeAddr(t)
		if tc.environ["DATABASE_URL"] == "" {
			tc.environ["DATABASE_URL"] = testenv.ServerURL(t, testenv.TestDatabaseName())
		}
		var out bytes.Buffer
		if err := run(t.Context(), nil, tc.environ, &out, &out); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want %q", name, err, tc.want)
		}
	}

	name := testenv.TestDatabaseName()
	testenv.DropDatabaseAtCleanup(t, name)
	base, stop, logs := serve(t, map[string]string{"DATABASE_URL": testenv.ServerURL(t, name), "DEV_MODE": "true",
		"API_JWT_SECRET_FILE": devSecretFile})
	if code := postOrder(t, base, mint(t, config.DevelopmentJWTSecret, "c")); code != http.StatusCreated {
		t.Errorf("POST /v1/orders with a token of the development secret, in development: %d", code)
	}
	if err := stop(); err != nil {
		t.Fatalf("run: %v", err)
	}
	var warned bool
	for line := range strings.Lines(logs.String()) {
		warned = warned || strings.Contains(line, `"level":"WARN"`) && strings.Contains(line, "DEV_MODE=true")
	}
	if !warned {
		t.Errorf("no WARN line about DEV_MODE=true:\n%s", logs.String())
	}
}

// API_AUTH=off must be asked for, and is warned about at start: then
// every request is an operator's, without a token.
func TestAuthOffWarnsAndLetsEveryoneIn(t *testing.T) {
	t.Parallel()
	name := testenv.TestDatabaseName()
	testenv.DropDatabaseAtCleanup(t, name)
	base, stop, logs := serve(t, map[string]string{"DATABASE_URL": testenv.ServerURL(t, name), "API_AUTH": "off"})
	if code := postOrder(t, base, ""); code != http.StatusCreated {
		t.Errorf("POST /v1/orders without a token, auth off: %d", code)
	}
	resp, err := http.Get(base + "/v1/orders?customer_id=c")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"customer_id":"c"`) {
		t.Errorf("GET /v1/orders without a token, auth off: %d %s", resp.StatusCode, body)
	}
	if err := stop(); err != nil {
		t.Fatalf("run: %v", err)
	}
	var warned bool
	for line := range strings.Lines(logs.String()) {
		warned = warned || strings.Contains(line, `"level":"WARN"`) && strings.Contains(line, "API_AUTH=off") &&
			strings.Contains(line, "every request is treated as an operator")
	}
	if !warned {
		t.Errorf("no WARN line about API_AUTH=off:\n%s", logs.String())
	}
}

// Every variable order-api reads is documented on the configuration page.
func TestConfigurationPageDocumentsEveryVariable(t *testing.T) {
	t.Parallel()
	testenv.ConfigurationDocuments(t, config.Variables(&Config{}))
}

// serve runs order-api with -migrate and environ on a free address until
// stop (a SIGTERM: it drains and returns run's error); it returns when
// /readyz answers.
func serve(t *testing.T, environ map[string]string) (base string, stop func() error, logs *syncBuffer) {
	t.Helper()
	addr := testenv.FreeAddr(t)
	environ["HTTP_ADDR"] = addr
	ctx, cancel := context.WithCancel(t.Context())
	var (
		wg     sync.WaitGroup
		runErr error
	)
	logs = &syncBuffer{}
	wg.Go(func() { runErr = run(ctx, []string{"-migrate"}, environ, logs, logs) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	base = "http://" + addr
	testenv.WaitOK(t, 20*time.Second, base+"/readyz")
	return base, func() error { cancel(); wg.Wait(); return runErr }, logs
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
