package httpapi_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/jackc/pgx/v5/pgxpool"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/yourorg/orders/api"
	"github.com/yourorg/orders/api/apicheck"
	"github.com/yourorg/orders/internal/auth"
	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/httpapi"
	"github.com/yourorg/orders/internal/testenv"
	"github.com/yourorg/orders/migrations"
)

type testBundle struct {
	t       *testing.T
	pool    *pgxpool.Pool // the test's own, as the schema's owner
	api     *pgxpool.Pool // the API's
	server  *httptest.Server
	client  *http.Client // checks every exchange against api/openapi.yaml
	secret  []byte       // the API's HS256 secret
	handler http.Handler // the API the server serves
	// tlsConfig trusts a TLS server of the test's, when it starts one.
	tlsConfig *tls.Config
}

// setup starts the API on a fresh database. Every request the bundle
// sends, and every answer, is checked against api/openapi.yaml
// (apicheck).
func setup(t *testing.T) *testBundle {
	t.Helper()
	return setupWith(t, nil)
}

// setupWith is setup with the API's config and dependencies changed by
// change (when not nil) before it starts. The bundle's pool is the test's
// own on the database, whatever pool the API is given. The API's pool
// connects as order-api's role, orders_api: a statement it has no grant
// for fails the test. The API verifies tokens with a secret of its own;
// b.do sends an operator's token unless told otherwise (b.token).
func setupWith(t *testing.T, change func(*httpapi.Config, *httpapi.Deps)) *testBundle {
	t.Helper()
	db := testenv.NewDatabase(t, migrations.Schemas...)
	apiPool, err := database.NewPool(t.Context(), database.PoolConfig{URL: db.URLAs(migrations.RoleAPI)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(apiPool.Close)
	secret := []byte(rand.Text() + rand.Text())
	verifier, err := auth.NewVerifier(auth.Options{Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	cfg := httpapi.Config{IdempotencyKeyTTL: time.Hour}
	deps := httpapi.Deps{
		Verifier:       verifier,
		Pool:           apiPool,
		Logger:         slog.New(slog.NewTextHandler(io.Discard, nil)),
		TracerProvider: tracenoop.NewTracerProvider(),
		MeterProvider:  metricnoop.NewMeterProvider(),
		MetricsHandler: http.NotFoundHandler(),
	}
	if change != nil {
		change(&cfg, &deps)
	}
	handler, err := httpapi.New(cfg, deps)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(handler)
	t.Cleanup(srv.Close)
	return &testBundle{t: t, pool: db.Pool, api: deps.Pool, server: srv, client: apicheck.Client(t), secret: secret, handler: handler}
}

// token mints a token the API accepts, for a customer (role customer or
// "") or an operator, valid for an hour.
func (b *testBundle) token(sub string, role auth.Role) string {
	b.t.Helper()
	token, err := auth.Mint(b.secret, auth.Principal{Subject: sub, Role: role}, time.Hour, "", "")
	if err != nil {
		b.t.Fatal(err)
	}
	return token
}

// as is the header of a request by sub with role.
func (b *testBundle) as(sub string, role auth.Role) header {
	return header{"Authorization": "Bearer " + b.token(sub, role)}
}

type response struct {
	status int
	header http.Header
	body   []byte
	// closed: the server closes the connection after this answer
	// ("Connection: close", which the client takes out of header).
	closed bool
}

func (r response) decode(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal(r.body, v); err != nil {
		t.Fatalf("decode %s: %v", r.body, err)
	}
}

// problem decodes a problem+json response and checks its shape.
func (r response) problem(t *testing.T) httpapi.Problem {
	t.Helper()
	if ct := r.header.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type = %q, want application/problem+json (body %s)", ct, r.body)
	}
	var p httpapi.Problem
	r.decode(t, &p)
	if p.Status != r.status || p.Title == "" || p.Code == "" || p.CorrelationID == "" {
		t.Fatalf("problem %+v for status %d", p, r.status)
	}
	return p
}

type header map[string]string

// do sends a request with the headers h, as an operator unless h has an
// Authorization header ("" sends none).
func (b *testBundle) do(method, path string, body []byte, h header) response {
	b.t.Helper()
	req, err := http.NewRequestWithContext(b.t.Context(), method, b.server.URL+path, bytes.NewReader(body))
	if err != nil {
		b.t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if _, ok := h["Authorization"]; !ok {
		req.Header.Set("Authorization", "Bearer "+b.token("operator-1", auth.RoleOperator))
	}
	for k, v := range h {
		if v == "" {
			req.Header.Del(k)
		} else {
			req.Header.Set(k, v)
		}
	}
	resp, err := b.client.Do(req)
	if err != nil {
		b.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		b.t.Fatal(err)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: out, closed: resp.Close}
}

func (b *testBundle) count(table string) int {
	b.t.Helper()
	var n int
	if err := b.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+table).Scan(&n); err != nil {
		b.t.Fatal(err)
	}
	return n
}

const validOrder = `{"customer_id":"c-1","currency":"EUR","items":[{"sku":"A-1","quantity":2,"unit_price_cents":1250}]}`

type orderBody struct {
	OrderID    string `json:"order_id"`
	CustomerID string `json:"customer_id"`
	Status     string `json:"status"`
	Version    int    `json:"version"`
	Currency   string `json:"currency"`
	TotalCents int64  `json:"total_cents"`
	Items      []struct {
		SKU            string `json:"sku"`
		Quantity       int    `json:"quantity"`
		UnitPriceCents int64  `json:"unit_price_cents"`
	} `json:"items"`
	History []struct {
		FromStatus    string  `json:"from_status"`
		ToStatus      string  `json:"to_status"`
		MessageID     *string `json:"message_id"`
		CorrelationID string  `json:"correlation_id"`
	} `json:"history"`
}

func (b *testBundle) createOrder(body string, h header) orderBody {
	b.t.Helper()
	r := b.do(http.MethodPost, "/v1/orders", []byte(body), h)
	if r.status != http.StatusCreated {
		b.t.Fatalf("create: %d %s", r.status, r.body)
	}
	var o orderBody
	r.decode(b.t, &o)
	return o
}

func TestCreateOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.do(http.MethodPost, "/v1/orders", []byte(validOrder), header{httpapi.HeaderCorrelationID: "corr-42"})
	if r.status != http.StatusCreated {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	var o orderBody
	r.decode(t, &o)
	if o.Status != "SUBMITTED" || o.Version != 1 || o.TotalCents != 2500 || o.CustomerID != "c-1" || len(o.Items) != 1 {
		t.Fatalf("order = %+v", o)
	}
	if loc := r.header.Get("Location"); loc != "/v1/orders/"+o.OrderID {
		t.Errorf("Location = %q", loc)
	}
	if got := r.header.Get(httpapi.HeaderCorrelationID); got != "corr-42" {
		t.Errorf("X-Correlation-ID = %q, want it echoed", got)
	}
	if len(o.History) != 1 || o.History[0].FromStatus != "" || o.History[0].ToStatus != "SUBMITTED" ||
		o.History[0].MessageID != nil || o.History[0].CorrelationID != "corr-42" {
		t.Errorf("history = %+v", o.History)
	}

	// One order, one order.submitted outbox row carrying the correlation id.
	var typ, corr string
	err := b.pool.QueryRow(t.Context(), `SELECT message_type, headers->>'correlation_id' FROM message_outbox WHERE aggregate_id = $1`, o.OrderID).Scan(&typ, &corr)
	if err != nil || typ != "order.submitted" || corr != "corr-42" || b.count("message_outbox") != 1 || b.count("orders") != 1 {
		t.Fatalf("outbox row %s %s: %v", typ, corr, err)
	}

	// GET returns the same order.
	g := b.do(http.MethodGet, "/v1/orders/"+o.OrderID, nil, nil)
	var got orderBody
	g.decode(t, &got)
	if g.status != http.StatusOK || got.OrderID != o.OrderID || len(got.History) != 1 {
		t.Fatalf("get: %d %s", g.status, g.body)
	}
}

func TestCorrelationIDIsGeneratedWhenMissingOrInvalid(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, sent := range []string{"", strings.Repeat("x", 129), "caf\xc3\xa9"} {
		r := b.do(http.MethodGet, "/healthz", nil, header{httpapi.HeaderCorrelationID: sent})
		got := r.header.Get(httpapi.HeaderCorrelationID)
		if got == "" || got == sent {
			t.Errorf("sent %q, got %q: want a generated id", sent, got)
		}
	}
}

// A failure inside the create transaction, after the outbox insert,
// leaves neither the order nor its outbox row. The failure is a real
// constraint of this test's database that rejects one customer's outbox row;
// the answer is a database's failure, 503 database_error.
func TestCreateOrderFailureAfterOutboxInsertWritesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.pool.Exec(t.Context(), `ALTER TABLE message_outbox ADD CONSTRAINT test_reject_customer
		CHECK (payload->>'customer_id' IS DISTINCT FROM 'reject-me')`)
	if err != nil {
		t.Fatal(err)
	}
	body := strings.Replace(validOrder, `"c-1"`, `"reject-me"`, 1)
	r := b.do(http.MethodPost, "/v1/orders", []byte(body), header{httpapi.HeaderIdempotencyKey: "k-fail"})
	if r.status != http.StatusServiceUnavailable || r.problem(t).Code != "database_error" {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	for _, table := range []string{"orders", "order_items", "order_state_transition", "message_outbox", "http_idempotency_key"} {
		if n := b.count(table); n != 0 {
			t.Errorf("%s has %d rows", table, n)
		}
	}
	// The key was not spent on the failure: the same request can be retried.
	b.createOrder(validOrder, header{httpapi.HeaderIdempotencyKey: "k-fail"})
}

func TestIdempotencyKeyReplay(t *testing.T) {
	t.Parallel()
	b := setup(t)
	key := header{httpapi.HeaderIdempotencyKey: "order-1"}
	first := b.do(http.MethodPost, "/v1/orders", []byte(validOrder), key)
	if first.status != http.StatusCreated || first.header.Get(httpapi.HeaderIdempotentReplayed) != "" {
		t.Fatalf("first: %d %v", first.status, first.header)
	}
	// The same body, spaced differently, is the same request.
	respaced := strings.ReplaceAll(validOrder, ",", " , ")
	again := b.do(http.MethodPost, "/v1/orders", []byte(respaced), key)
	if again.status != first.status || !bytes.Equal(again.body, first.body) ||
		again.header.Get("Location") != first.header.Get("Location") ||
		again.header.Get(httpapi.HeaderIdempotentReplayed) != "true" {
		t.Fatalf("replay: %d %v %s\nfirst: %s", again.status, again.header, again.body, first.body)
	}
	if b.count("orders") != 1 || b.count("message_outbox") != 1 {
		t.Fatalf("a replay created something: %d orders, %d outbox rows", b.count("orders"), b.count("message_outbox"))
	}

	// The same key with a different body is refused, and creates nothing.
	other := strings.Replace(validOrder, `"quantity":2`, `"quantity":3`, 1)
	r := b.do(http.MethodPost, "/v1/orders", []byte(other), key)
	if r.status != http.StatusUnprocessableEntity || r.problem(t).Code != "idempotency_key_reused" {
		t.Fatalf("other body: %d %s", r.status, r.body)
	}
	if b.count("orders") != 1 {
		t.Fatal("the refused request created an order")
	}
	// Without a key, the same body is a new order.
	b.createOrder(validOrder, nil)
	if b.count("orders") != 2 {
		t.Fatal("want a second order")
	}
}

// Twenty concurrent requests with one key create exactly one order; every
// other request is a replay of its response or a 409 while it runs.
func TestIdempotencyKeyConcurrent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const n = 20
	var (
		wg        sync.WaitGroup
		mu        sync.Mutex
		responses []response
	)
	start := make(chan struct{})
	for range n {
		wg.Go(func() {
			<-start
			r := b.do(http.MethodPost, "/v1/orders", []byte(validOrder), header{httpapi.HeaderIdempotencyKey: "same-key"})
			mu.Lock()
			responses = append(responses, r)
			mu.Unlock()
		})
	}
	close(start)
	wg.Wait()

	var created, replayed, inFlight int
	var body []byte
	for _, r := range responses {
		switch {
		case r.status == http.StatusCreated && r.header.Get(httpapi.HeaderIdempotentReplayed) == "":
			created++
			body = r.body
		case r.status == http.StatusCreated:
			replayed++
		case r.status == http.StatusConflict && r.problem(t).Code == "idempotency_key_in_use":
			inFlight++
		default:
			t.Errorf("unexpected response %d %s", r.status, r.body)
		}
	}
	if created != 1 || created+replayed+inFlight != n {
		t.Fatalf("created %d, replayed %d, in flight %d", created, replayed, inFlight)
	}
	for _, r := range responses {
		if r.status == http.StatusCreated && !bytes.Equal(r.body, body) {
			t.Errorf("a replay differs from the first response:\n%s\n%s", r.body, body)
		}
	}
	if b.count("orders") != 1 || b.count("message_outbox") != 1 {
		t.Fatalf("%d orders, %d outbox rows; want 1 and 1", b.count("orders"), b.count("message_outbox"))
	}
	t.Logf("%d requests: 1 created, %d replayed, %d told the key was in use", n, replayed, inFlight)
}

// The bad-input battery of docs/contract.md: each gets its status and a
// problem+json body, and nothing is written.
func TestCreateOrderBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	order := func(customer, currency, items string) string {
		return fmt.Sprintf(`{"customer_id":%q,"currency":%q,"items":%s}`, customer, currency, items)
	}
	item := func(sku string, qty int, price int64) string {
		return fmt.Sprintf(`{"sku":%q,"quantity":%d,"unit_price_cents":%d}`, sku, qty, price)
	}
	items := func(n int) string {
		parts := make([]string, n)
		for i := range parts {
			parts[i] = item("S", 1, 1)
		}
		return "[" + strings.Join(parts, ",") + "]"
	}
	good := item("A-1", 1, 100)
	cases := []struct {
		name   string
		body   string
		header header
		status int
		code   string
		field  string // the field named in errors, for 422
	}{
		{"malformed JSON", `{"customer_id":`, nil, 400, "malformed_json", ""},
		{"not JSON", `hello`, nil, 400, "malformed_json", ""},
		{"empty body", ``, nil, 400, "malformed_json", ""},
		{"two JSON values", validOrder + validOrder, nil, 400, "malformed_json", ""},
		{"unknown field", `{"customer_id":"c","currency":"EUR","items":[` + good + `],"coupon":"X"}`, nil, 400, "malformed_json", ""},
		{"unknown item field", order("c", "EUR", `[{"sku":"A","quantity":1,"unit_price_cents":1,"color":"red"}]`), nil, 400, "malformed_json", ""},
		{"wrong type", `{"customer_id":1,"currency":"EUR","items":[]}`, nil, 400, "invalid_type", ""},
		{"quantity as string", order("c", "EUR", `[{"sku":"A","quantity":"2","unit_price_cents":1}]`), nil, 400, "invalid_type", ""},
		{"fractional quantity", order("c", "EUR", `[{"sku":"A","quantity":1.5,"unit_price_cents":1}]`), nil, 400, "invalid_type", ""},
		{"null body", `null`, nil, 400, "invalid_type", ""},
		{"array body", `[` + validOrder + `]`, nil, 400, "invalid_type", ""},
		{"key twice", `{"customer_id":"c-2","customer_id":"c-1","currency":"EUR","items":[` + good + `]}`, nil, 400, "malformed_json", ""},
		{"nested key twice", order("c", "EUR", `[{"sku":"A","sku":"B","quantity":1,"unit_price_cents":1}]`), nil, 400, "malformed_json", ""},
		{"wrong content type", validOrder, header{"Content-Type": "text/plain"}, 415, "unsupported_media_type", ""},
		{"no content type", validOrder, header{"Content-Type": ""}, 415, "unsupported_media_type", ""},
		{"form content type", validOrder, header{"Content-Type": "application/x-www-form-urlencoded"}, 415, "unsupported_media_type", ""},
		{"body over 64 KiB", order(strings.Repeat("c", 64<<10), "EUR", "["+good+"]"), nil, 413, "body_too_large", ""},
		{"bad Idempotency-Key", validOrder, header{httpapi.HeaderIdempotencyKey: strings.Repeat("k", 256)}, 400, "invalid_idempotency_key", ""},
		{"customer_id empty", order("", "EUR", "["+good+"]"), nil, 422, "validation_failed", "customer_id"},
		{"customer_id 65 chars", order(strings.Repeat("c", 65), "EUR", "["+good+"]"), nil, 422, "validation_failed", "customer_id"},
		{"customer_id missing", `{"currency":"EUR","items":[` + good + `]}`, nil, 422, "validation_failed", "customer_id"},
		{"currency lower case", order("c", "eur", "["+good+"]"), nil, 422, "validation_failed", "currency"},
		{"currency 4 letters", order("c", "EURO", "["+good+"]"), nil, 422, "validation_failed", "currency"},
		{"no items", order("c", "EUR", "[]"), nil, 422, "validation_failed", "items"},
		{"items missing", `{"customer_id":"c","currency":"EUR"}`, nil, 422, "validation_failed", "items"},
		{"101 items", order("c", "EUR", items(101)), nil, 422, "validation_failed", "items"},
		{"sku empty", order("c", "EUR", "["+item("", 1, 1)+"]"), nil, 422, "validation_failed", "items[0].sku"},
		{"sku 65 chars", order("c", "EUR", "["+item(strings.Repeat("s", 65), 1, 1)+"]"), nil, 422, "validation_failed", "items[0].sku"},
		{"quantity 0", order("c", "EUR", "["+item("A", 0, 1)+"]"), nil, 422, "validation_failed", "items[0].quantity"},
		{"quantity 10001", order("c", "EUR", "["+good+","+item("A", 10001, 1)+"]"), nil, 422, "validation_failed", "items[1].quantity"},
		{"price -1", order("c", "EUR", "["+item("A", 1, -1)+"]"), nil, 422, "validation_failed", "items[0].unit_price_cents"},
		{"price 10^9+1", order("c", "EUR", "["+item("A", 1, 1_000_000_001)+"]"), nil, 422, "validation_failed", "items[0].unit_price_cents"},
		{"price missing", order("c", "EUR", `[{"sku":"A","quantity":1}]`), nil, 422, "validation_failed", "items[0].unit_price_cents"},
		// PostgreSQL cannot store a NUL in text, and must not be the one to say so (a 500).
		{"NUL in customer_id", `{"customer_id":"c\u0000d","currency":"EUR","items":[` + good + `]}`, nil, 422, "validation_failed", "customer_id"},
		{"NUL in sku", order("c", "EUR", `[{"sku":"A\u0000","quantity":1,"unit_price_cents":1}]`), nil, 422, "validation_failed", "items[0].sku"},
		{"NUL in currency", `{"customer_id":"c","currency":"EU\u0000","items":[` + good + `]}`, nil, 422, "validation_failed", "currency"},
		// encoding/json would turn these bytes into U+FFFD and store that.
		{"invalid UTF-8 in a string", `{"customer_id":"c` + "\xff" + `","currency":"EUR","items":[` + good + `]}`, nil, 400, "malformed_json", ""},
		{"invalid UTF-8 in a key", `{"customer_id":"c","currency":"EUR","items":[` + good + `],"x` + "\xc3" + `":1}`, nil, 400, "malformed_json", ""},
		// Data after the JSON value, of every kind (Decoder.More misses ] and }).
		{"trailing ]", validOrder + "]", nil, 400, "malformed_json", ""},
		{"trailing }", validOrder + "}", nil, 400, "malformed_json", ""},
		{"trailing word", validOrder + " x", nil, 400, "malformed_json", ""},
		{"trailing number", validOrder + "1", nil, 400, "malformed_json", ""},
		// encoding/json matches keys case-insensitively; the API does not.
		{"key in other case", `{"Customer_ID":"c","currency":"EUR","items":[` + good + `]}`, nil, 400, "malformed_json", ""},
		{"nested key in other case", order("c", "EUR", `[{"SKU":"A","quantity":1,"unit_price_cents":1}]`), nil, 400, "malformed_json", ""},
		{"key twice, other case", `{"customer_id":"c","currency":"EUR","CURRENCY":"USD","items":[` + good + `]}`, nil, 400, "malformed_json", ""},
	}
	for _, c := range cases {
		r := b.do(http.MethodPost, "/v1/orders", []byte(c.body), c.header)
		if r.status != c.status {
			t.Errorf("%s: status %d, want %d: %s", c.name, r.status, c.status, r.body)
			continue
		}
		p := r.problem(t)
		if p.Code != c.code {
			t.Errorf("%s: code %q, want %q", c.name, p.Code, c.code)
		}
		if c.field != "" && (len(p.Errors) != 1 || p.Errors[0].Field != c.field || p.Errors[0].Message == "") {
			t.Errorf("%s: errors %+v, want one for %s", c.name, p.Errors, c.field)
		}
	}
	// The boundaries themselves are accepted (and only these write).
	for _, body := range []string{
		order(strings.Repeat("é", 64), "EUR", items(100)),
		order("c", "USD", "["+item(strings.Repeat("s", 64), 10000, 1_000_000_000)+"]"),
		order("c", "EUR", "["+item("A", 1, 0)+"]"),
	} {
		b.createOrder(body, nil)
	}
	if b.count("orders") != 3 || b.count("message_outbox") != 3 || b.count("http_idempotency_key") != 0 {
		t.Fatalf("rows: %d orders, %d outbox; want only the 3 valid ones", b.count("orders"), b.count("message_outbox"))
	}
}

// A refused body says what is wrong and where, naming a field by its path
// as the 422's errors do (items[1].quantity), the body itself as "the
// body": a null body is not taken for an empty order, a key given twice is
// not decided by the last one, and a value of the wrong JSON type is
// invalid_type, not malformed JSON. Nothing is written.
func TestBadBodiesSayWhatAndWhere(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const item = `{"sku":"A","quantity":1,"unit_price_cents":1}`
	for _, c := range []struct{ name, body, code, detail string }{
		{"null", `null`, "invalid_type", "The body is null: it must be a JSON object."},
		{"an array", `[]`, "invalid_type", "The body must be a JSON object, not an array."},
		{"a string", `"order"`, "invalid_type", "The body must be a JSON object, not a string."},
		{"a string for a number, second item", `{"customer_id":"c-1","currency":"EUR","items":[` + item + `,{"sku":"B","quantity":"2","unit_price_cents":1}]}`,
			"invalid_type", "Field items[1].quantity must be a JSON number, not a string."},
		{"an object for a string", `{"customer_id":{"id":"c-1"},"currency":"EUR","items":[` + item + `]}`,
			"invalid_type", "Field customer_id must be a JSON string, not an object."},
		{"an item that is not an object", `{"customer_id":"c-1","currency":"EUR","items":[` + item + `,7]}`,
			"invalid_type", "Field items[1] must be a JSON object, not a number."},
		{"a fraction", `{"customer_id":"c-1","currency":"EUR","items":[{"sku":"A","quantity":1.5,"unit_price_cents":1}]}`,
			"invalid_type", "Field items[0].quantity must be a whole number, without a fraction or an exponent, not 1.5."},
		{"out of range", `{"customer_id":"c-1","currency":"EUR","items":[{"sku":"A","quantity":1,"unit_price_cents":99999999999999999999}]}`,
			"invalid_type", "Field items[0].unit_price_cents is out of range: 99999999999999999999."},
		{"customer_id twice", `{"customer_id":"c-2","customer_id":"c-1","currency":"EUR","items":[` + item + `]}`,
			"malformed_json", `Field "customer_id" is given twice: each field may appear once.`},
		{"a nested key twice", `{"customer_id":"c-1","currency":"EUR","items":[` + item + `,{"sku":"A","quantity":1,"quantity":2,"unit_price_cents":1}]}`,
			"malformed_json", `Field "items[1].quantity" is given twice: each field may appear once.`},
		{"an unknown nested key", `{"customer_id":"c-1","currency":"EUR","items":[{"sku":"A","Quantity":1,"unit_price_cents":1}]}`,
			"malformed_json", `Unknown field "items[0].Quantity": field names are case-sensitive.`},
		{"empty", ``, "malformed_json", "The body is empty."},
	} {
		r := b.do(http.MethodPost, "/v1/orders", []byte(c.body), nil)
		if r.status != http.StatusBadRequest {
			t.Errorf("%s: %d %s, want 400", c.name, r.status, r.body)
			continue
		}
		if p := r.problem(t); p.Code != c.code || p.Detail != c.detail {
			t.Errorf("%s: %s %q, want %s %q", c.name, p.Code, p.Detail, c.code, c.detail)
		}
	}
	if n := b.count("orders"); n != 0 {
		t.Errorf("%d orders written by refused bodies", n)
	}
}

func TestGetOrderUnknownOrMalformedID(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, path := range []string{
		"/v1/orders/01a22b33-547c-7be9-ad1e-5920dad5df79",
		"/v1/orders/not-a-uuid",
		"/v1/orders/01a22b33-547c-7be9-ad1e-5920dad5df79/cancel",
		"/v1/orders/%00/cancel",
	} {
		method := http.MethodGet
		if strings.HasSuffix(path, "/cancel") {
			method = http.MethodPost
		}
		r := b.do(method, path, nil, nil)
		if r.status != http.StatusNotFound || r.problem(t).Code != "not_found" {
			t.Errorf("%s %s: %d %s", method, path, r.status, r.body)
		}
	}
	if b.count("message_outbox") != 0 {
		t.Fatal("a 404 wrote an outbox row")
	}
}

func TestUnknownRouteAndMethod(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if r := b.do(http.MethodGet, "/v2/nothing", nil, nil); r.status != http.StatusNotFound || r.problem(t).Code != "not_found" {
		t.Errorf("unknown route: %d %s", r.status, r.body)
	}
	if r := b.do(http.MethodDelete, "/v1/orders", nil, nil); r.status != http.StatusMethodNotAllowed || r.problem(t).Code != "method_not_allowed" {
		t.Errorf("unknown method: %d %s", r.status, r.body)
	}
}

func TestCancelOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	o := b.createOrder(validOrder, nil)

	r := b.do(http.MethodPost, "/v1/orders/"+o.OrderID+"/cancel", nil, header{httpapi.HeaderCorrelationID: "cancel-1"})
	var got orderBody
	r.decode(t, &got)
	if r.status != http.StatusOK || got.Status != "CANCELLED" || got.Version != 2 || len(got.History) != 2 ||
		got.History[1].FromStatus != "SUBMITTED" || got.History[1].ToStatus != "CANCELLED" || got.History[1].CorrelationID != "cancel-1" {
		t.Fatalf("cancel: %d %s", r.status, r.body)
	}
	var corr string
	err := b.pool.QueryRow(t.Context(), `SELECT headers->>'correlation_id' FROM message_outbox WHERE message_type = 'order.cancelled' AND aggregate_id = $1`, o.OrderID).Scan(&corr)
	if err != nil || corr != "cancel-1" {
		t.Fatalf("order.cancelled outbox row: %q %v", corr, err)
	}

	// Cancelling again is a 200 that changes nothing.
	again := b.do(http.MethodPost, "/v1/orders/"+o.OrderID+"/cancel", nil, nil)
	var same orderBody
	again.decode(t, &same)
	if again.status != http.StatusOK || same.Status != "CANCELLED" || same.Version != 2 || len(same.History) != 2 {
		t.Fatalf("second cancel: %d %s", again.status, again.body)
	}
	if b.count("message_outbox") != 2 {
		t.Fatalf("want 2 outbox rows (submitted, cancelled), have %d", b.count("message_outbox"))
	}
}

func TestCancelFromEachStatus(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cases := []struct {
		status string
		want   int
	}{
		{"SUBMITTED", http.StatusOK},
		{"FULFILLMENT_REQUESTED", http.StatusOK},
		{"CANCELLED", http.StatusOK},
		{"FULFILLED", http.StatusConflict},
		{"REJECTED", http.StatusConflict},
	}
	for _, c := range cases {
		o := b.createOrder(validOrder, nil)
		if _, err := b.pool.Exec(t.Context(), "UPDATE orders SET status = $1 WHERE order_id = $2", c.status, o.OrderID); err != nil {
			t.Fatal(err)
		}
		outboxBefore := b.count("message_outbox")
		r := b.do(http.MethodPost, "/v1/orders/"+o.OrderID+"/cancel", nil, nil)
		if r.status != c.want {
			t.Errorf("cancel from %s: %d %s", c.status, r.status, r.body)
			continue
		}
		wrote := b.count("message_outbox") - outboxBefore
		switch {
		case c.want == http.StatusConflict:
			if p := r.problem(t); p.Code != "order_final" || !strings.Contains(p.Detail, c.status) {
				t.Errorf("cancel from %s: %+v", c.status, p)
			}
			if wrote != 0 {
				t.Errorf("cancel from %s wrote %d outbox rows", c.status, wrote)
			}
		case c.status == "CANCELLED":
			if wrote != 0 {
				t.Errorf("no-op cancel wrote %d outbox rows", wrote)
			}
		default:
			if wrote != 1 {
				t.Errorf("cancel from %s wrote %d outbox rows, want 1", c.status, wrote)
			}
		}
	}
}

// Two concurrent cancels: one transition, one order.cancelled row.
func TestConcurrentCancels(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for range 5 {
		o := b.createOrder(validOrder, nil)
		var wg sync.WaitGroup
		statuses := make([]int, 2)
		for i := range statuses {
			wg.Go(func() {
				statuses[i] = b.do(http.MethodPost, "/v1/orders/"+o.OrderID+"/cancel", nil, nil).status
			})
		}
		wg.Wait()
		if statuses[0] != http.StatusOK || statuses[1] != http.StatusOK {
			t.Fatalf("statuses %v", statuses)
		}
		var transitions, cancelled int
		ctx := t.Context()
		_ = b.pool.QueryRow(ctx, "SELECT count(*) FROM order_state_transition WHERE order_id = $1 AND to_status = 'CANCELLED'", o.OrderID).Scan(&transitions)
		_ = b.pool.QueryRow(ctx, "SELECT count(*) FROM message_outbox WHERE aggregate_id = $1 AND message_type = 'order.cancelled'", o.OrderID).Scan(&cancelled)
		if transitions != 1 || cancelled != 1 {
			t.Fatalf("%d transitions, %d order.cancelled rows; want 1 and 1", transitions, cancelled)
		}
	}
}

func TestListOrders(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var ids []string
	for range 5 {
		ids = append(ids, b.createOrder(validOrder, nil).OrderID)
	}
	b.do(http.MethodPost, "/v1/orders/"+ids[1]+"/cancel", nil, nil)

	type page struct {
		Orders     []orderBody `json:"orders"`
		NextCursor *string     `json:"next_cursor"`
	}
	var seen []string
	path := "/v1/orders?limit=2"
	for {
		r := b.do(http.MethodGet, path, nil, nil)
		var p page
		r.decode(t, &p)
		if r.status != http.StatusOK {
			t.Fatalf("%s: %d", path, r.status)
		}
		for _, o := range p.Orders {
			seen = append(seen, o.OrderID)
			if o.History != nil {
				t.Error("list items carry no history")
			}
		}
		if p.NextCursor == nil {
			break
		}
		path = "/v1/orders?limit=2&after=" + *p.NextCursor
	}
	want := []string{ids[4], ids[3], ids[2], ids[1], ids[0]}
	if fmt.Sprint(seen) != fmt.Sprint(want) {
		t.Fatalf("walked %v, want newest first %v", seen, want)
	}

	var cancelled page
	b.do(http.MethodGet, "/v1/orders?status=CANCELLED", nil, nil).decode(t, &cancelled)
	if len(cancelled.Orders) != 1 || cancelled.Orders[0].OrderID != ids[1] || cancelled.NextCursor != nil {
		t.Fatalf("status filter: %+v", cancelled)
	}

	for _, bad := range []string{"?limit=0", "?limit=201", "?limit=x", "?status=LOST", "?after=%21%21", "?after=bm9wZQ"} {
		r := b.do(http.MethodGet, "/v1/orders"+bad, nil, nil)
		if r.status != http.StatusBadRequest || r.problem(t).Code != "invalid_query" {
			t.Errorf("%s: %d %s", bad, r.status, r.body)
		}
	}
}

// A filter given empty is a 400 that says so, not a filter left out: an
// operator's customer_id= (an unset variable) must not list every
// customer's orders. The same with a value beside it.
func TestListOrdersEmptyParameter(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.createOrder(validOrder, nil)
	for _, query := range []string{"customer_id=", "status=", "limit=", "after=", "status=CANCELLED&customer_id=", "customer_id=c-1&limit="} {
		name, _, _ := strings.Cut(query[strings.LastIndex(query, "&")+1:], "=")
		r := b.do(http.MethodGet, "/v1/orders?"+query, nil, nil)
		if r.status != http.StatusBadRequest {
			t.Errorf("?%s: %d %s, want 400", query, r.status, r.body)
			continue
		}
		if p := r.problem(t); p.Code != "invalid_query" || !strings.HasPrefix(p.Detail, fmt.Sprintf("Query parameter %q is empty: give ", name)) {
			t.Errorf("?%s: %s %q, want invalid_query saying %s is empty", query, p.Code, p.Detail, name)
		}
	}
}

// customer_id filters the list, alone or with status, and its pages walk
// every matching order once, newest first, while orders are created.
func TestListOrdersByCustomer(t *testing.T) {
	t.Parallel()
	b := setup(t)
	forCustomer := func(customer string) string {
		return strings.Replace(validOrder, `"c-1"`, fmt.Sprintf("%q", customer), 1)
	}
	var alice, aliceCancelled []string // newest first
	for i := range 9 {
		customer := []string{"alice", "bob", "alicia"}[i%3]
		o := b.createOrder(forCustomer(customer), nil)
		if customer != "alice" {
			continue
		}
		alice = append([]string{o.OrderID}, alice...)
		if i%2 == 0 {
			b.do(http.MethodPost, "/v1/orders/"+o.OrderID+"/cancel", nil, nil)
			aliceCancelled = append([]string{o.OrderID}, aliceCancelled...)
		}
	}
	bob := b.createOrder(forCustomer("bob"), nil)
	b.do(http.MethodPost, "/v1/orders/"+bob.OrderID+"/cancel", nil, nil)

	type page struct {
		Orders     []orderBody `json:"orders"`
		NextCursor *string     `json:"next_cursor"`
	}
	walk := func(query string, limit int) []string {
		t.Helper()
		var seen []string
		path := fmt.Sprintf("/v1/orders?%s&limit=%d", query, limit)
		for pages := 0; ; pages++ {
			r := b.do(http.MethodGet, path, nil, nil)
			if r.status != http.StatusOK {
				t.Fatalf("%s: %d %s", path, r.status, r.body)
			}
			var p page
			r.decode(t, &p)
			for _, o := range p.Orders {
				seen = append(seen, o.OrderID)
			}
			if pages == 0 { // an order created during the walk is not in it
				b.createOrder(forCustomer("alice"), nil)
			}
			if p.NextCursor == nil {
				return seen
			}
			path = fmt.Sprintf("/v1/orders?%s&limit=%d&after=%s", query, limit, *p.NextCursor)
		}
	}
	if got := walk("customer_id=alice", 1); fmt.Sprint(got) != fmt.Sprint(alice) {
		t.Errorf("customer_id=alice walked %v, want %v", got, alice)
	}
	if got := walk("customer_id=alice&status=CANCELLED", 1); fmt.Sprint(got) != fmt.Sprint(aliceCancelled) {
		t.Errorf("customer_id=alice&status=CANCELLED walked %v, want %v", got, aliceCancelled)
	}
	if got := walk("status=CANCELLED&customer_id=bob", 2); fmt.Sprint(got) != fmt.Sprint([]string{bob.OrderID}) {
		t.Errorf("customer_id=bob&status=CANCELLED walked %v, want %v", got, []string{bob.OrderID})
	}
	if got := walk("customer_id=ali", 5); len(got) != 0 {
		t.Errorf("customer_id=ali (a prefix) walked %v, want nothing", got)
	}
	for _, bad := range []string{"?customer_id=" + strings.Repeat("c", 65), "?customer_id=a%00b", "?customer_id=%FF"} {
		r := b.do(http.MethodGet, "/v1/orders"+bad, nil, nil)
		if r.status != http.StatusBadRequest || r.problem(t).Code != "invalid_query" || !strings.Contains(r.problem(t).Detail, "customer_id") {
			t.Errorf("%s: %d %s", bad, r.status, r.body)
		}
	}
}

// A query parameter an endpoint does not take is a 400 that names it, not
// ignored: a misspelt filter would list everything, a stray flag on a write
// would seem to be obeyed. Nothing is written.
func TestUnknownQueryParameters(t *testing.T) {
	t.Parallel()
	b := setup(t)
	o := b.createOrder(validOrder, nil)
	cases := []struct {
		method, path, body, name string
	}{
		{http.MethodGet, "/v1/orders?stauts=CANCELLED", "", "stauts"},
		{http.MethodGet, "/v1/orders?status=CANCELLED&customerId=c-1", "", "customerId"},
		{http.MethodGet, "/v1/orders?Status=CANCELLED", "", "Status"},
		{http.MethodGet, "/v1/orders?status=CANCELLED&status=SUBMITTED", "", "status"},
		{http.MethodPost, "/v1/orders?dry_run=true", validOrder, "dry_run"},
		{http.MethodGet, "/v1/orders/" + o.OrderID + "?expand=items", "", "expand"},
		{http.MethodPost, "/v1/orders/" + o.OrderID + "/cancel?force=true", "", "force"},
	}
	for _, c := range cases {
		var body []byte
		if c.body != "" {
			body = []byte(c.body)
		}
		r := b.do(c.method, c.path, body, nil)
		if r.status != http.StatusBadRequest {
			t.Errorf("%s %s: %d %s, want 400", c.method, c.path, r.status, r.body)
			continue
		}
		if p := r.problem(t); p.Code != "invalid_query" || !strings.Contains(p.Detail, `"`+c.name+`"`) {
			t.Errorf("%s %s: %+v, want invalid_query naming %q", c.method, c.path, p, c.name)
		}
	}
	if n := b.count("orders"); n != 1 {
		t.Errorf("%d orders, want the 1 created before", n)
	}
	if n := b.count("message_outbox"); n != 1 {
		t.Errorf("%d outbox rows: a refused request wrote one", n)
	}
}

func TestHealthAndReadiness(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, path := range []string{"/healthz", "/readyz"} {
		if r := b.do(http.MethodGet, path, nil, nil); r.status != http.StatusOK {
			t.Errorf("%s: %d", path, r.status)
		}
	}
	b.api.Close() // the database is gone for this server
	r := b.do(http.MethodGet, "/readyz", nil, nil)
	if r.status != http.StatusServiceUnavailable || r.problem(t).Code != "not_ready" {
		t.Fatalf("readyz without a database: %d %s", r.status, r.body)
	}
	if r := b.do(http.MethodGet, "/healthz", nil, nil); r.status != http.StatusOK {
		t.Fatalf("healthz without a database: %d", r.status)
	}
}

func TestOpenAPIDocument(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.do(http.MethodGet, "/openapi.yaml", nil, nil)
	if r.status != http.StatusOK || !bytes.Equal(r.body, api.OpenAPI) {
		t.Fatalf("GET /openapi.yaml: %d", r.status)
	}
	r = b.do(http.MethodGet, "/asyncapi.yaml", nil, nil)
	if r.status != http.StatusOK || !bytes.Equal(r.body, api.AsyncAPI) || r.header.Get("Content-Type") != "application/yaml" {
		t.Fatalf("GET /asyncapi.yaml: %d %s", r.status, r.header.Get("Content-Type"))
	}
}

// Every route the server has is in the OpenAPI document, and every path
// and method of the document is a route.
func TestOpenAPIMatchesRoutes(t *testing.T) {
	t.Parallel()
	e, err := httpapi.New(httpapi.Config{IdempotencyKeyTTL: time.Hour}, httpapi.Deps{
		Verifier: auth.Off(), // the routes only: nothing is called
		Logger:   slog.New(slog.NewTextHandler(io.Discard, nil)), TracerProvider: tracenoop.NewTracerProvider(),
		MeterProvider: metricnoop.NewMeterProvider(), MetricsHandler: http.NotFoundHandler(),
	})
	if err != nil {
		t.Fatal(err)
	}
	served := map[string]bool{}
	for _, r := range e.Routes() {
		path := r.Path
		for _, p := range strings.Split(path, "/") {
			if strings.HasPrefix(p, ":") {
				path = strings.Replace(path, p, "{"+p[1:]+"}", 1)
			}
		}
		served[r.Method+" "+path] = true
	}
	doc, err := openapi3.NewLoader().LoadFromData(api.OpenAPI)
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	for path, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			documented[method+" "+path] = true
		}
	}
	for route := range served {
		if !documented[route] {
			t.Errorf("route %s is not in openapi.yaml", route)
		}
	}
	for route := range documented {
		if !served[route] {
			t.Errorf("openapi.yaml has %s, which the server does not serve", route)
		}
	}
}

// The history in a create's answer is written, not read back: it must be
// exactly what a GET of the order reads (created_at to the microsecond).
func TestCreatedOrderHistoryIsWhatGetReads(t *testing.T) {
	t.Parallel()
	b := setup(t)
	created := b.do(http.MethodPost, "/v1/orders", []byte(validOrder), header{httpapi.HeaderCorrelationID: "corr-h"})
	if created.status != http.StatusCreated {
		t.Fatalf("create: %d %s", created.status, created.body)
	}
	var post struct {
		OrderID string          `json:"order_id"`
		History json.RawMessage `json:"history"`
	}
	created.decode(t, &post)
	got := b.do(http.MethodGet, "/v1/orders/"+post.OrderID, nil, nil)
	var get struct {
		History json.RawMessage `json:"history"`
	}
	got.decode(t, &get)
	if string(post.History) != string(get.History) {
		t.Fatalf("history in the create's answer %s, read back %s", post.History, get.History)
	}
}
