package httpapi_test

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/yourorg/orders/api/apicheck"
	"github.com/yourorg/orders/internal/auth"
	"github.com/yourorg/orders/internal/config"
	"github.com/yourorg/orders/internal/httpapi"
	"github.com/yourorg/orders/internal/telemetry"
)

// orderOf is an order body for customer.
func orderOf(customer string) string {
	return fmt.Sprintf(`{"customer_id":%q,"currency":"EUR","items":[{"sku":"A-1","quantity":1,"unit_price_cents":100}]}`, customer)
}

// sign signs claims with method and key, outside the API's rules.
func sign(t *testing.T, method jwt.SigningMethod, key any, claims jwt.Claims) string {
	t.Helper()
	token, err := jwt.NewWithClaims(method, claims).SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return token
}

// claims are a customer's claims, valid for an hour unless changed.
func claims(sub string, change func(*auth.Claims)) *auth.Claims {
	c := &auth.Claims{RegisteredClaims: jwt.RegisteredClaims{
		Subject: sub, ExpiresAt: jwt.NewNumericDate(time.Now().Add(time.Hour)),
	}}
	if change != nil {
		change(c)
	}
	return c
}

func bearer(token string) header { return header{"Authorization": "Bearer " + token} }

// unauthorized checks a 401: problem+json with code, and the challenge
// (with error="invalid_token" when a token was sent).
func unauthorized(t *testing.T, what string, r response, code string) {
	t.Helper()
	if r.status != http.StatusUnauthorized {
		t.Fatalf("%s: %d, want 401\n%s", what, r.status, r.body)
	}
	if p := r.problem(t); p.Code != code {
		t.Errorf("%s: code %q, want %q", what, p.Code, code)
	}
	challenge := r.header.Get("WWW-Authenticate")
	if !strings.HasPrefix(challenge, "Bearer") {
		t.Errorf("%s: WWW-Authenticate %q, want Bearer", what, challenge)
	}
	if sent := code == "invalid_token"; sent != strings.Contains(challenge, `error="invalid_token"`) {
		t.Errorf("%s: WWW-Authenticate %q", what, challenge)
	}
}

// Every way a token can fail is a 401, on every route of /v1/, and
// nothing is written.
func TestRequestsWithoutAValidTokenAre401(t *testing.T) {
	t.Parallel()
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	b := setup(t)
	order := b.createOrder(validOrder, nil)
	routes := []struct {
		method, path string
		body         []byte
	}{
		{http.MethodPost, "/v1/orders", []byte(orderOf("c-1"))},
		{http.MethodGet, "/v1/orders", nil},
		{http.MethodGet, "/v1/orders/" + order.OrderID, nil},
		{http.MethodPost, "/v1/orders/" + order.OrderID + "/cancel", nil},
	}
	none := sign(t, jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, claims("c-1", nil))
	for _, tc := range []struct {
		name, code string
		h          header
	}{
		{"no token", "unauthenticated", header{"Authorization": ""}},
		{"another scheme", "invalid_token", header{"Authorization": "Basic YTpi"}},
		{"an empty bearer", "invalid_token", header{"Authorization": "Bearer "}},
		{"not a JWT", "invalid_token", bearer("not.a.jwt")},
		{"another secret", "invalid_token", bearer(sign(t, jwt.SigningMethodHS256, []byte(strings.Repeat("x", 32)), claims("c-1", nil)))},
		{"a changed payload", "invalid_token", bearer(func() string {
			parts := strings.Split(b.token("c-1", auth.RoleCustomer), ".")
			other := strings.Split(b.token("c-1", auth.RoleOperator), ".")
			return parts[0] + "." + other[1] + "." + parts[2] // an operator's claims under a customer's signature
		}())},
		{"expired", "invalid_token", bearer(sign(t, jwt.SigningMethodHS256, b.secret, claims("c-1", func(c *auth.Claims) {
			c.ExpiresAt = jwt.NewNumericDate(time.Now().Add(-2 * auth.Leeway))
		})))},
		{"no exp", "invalid_token", bearer(sign(t, jwt.SigningMethodHS256, b.secret, claims("c-1", func(c *auth.Claims) { c.ExpiresAt = nil })))},
		{"not valid yet", "invalid_token", bearer(sign(t, jwt.SigningMethodHS256, b.secret, claims("c-1", func(c *auth.Claims) {
			c.NotBefore = jwt.NewNumericDate(time.Now().Add(10 * time.Minute))
		})))},
		{"no sub", "invalid_token", bearer(sign(t, jwt.SigningMethodHS256, b.secret, claims("", nil)))},
		{"alg none", "invalid_token", bearer(none)},
		{"alg HS512 with the API's secret", "invalid_token", bearer(sign(t, jwt.SigningMethodHS512, b.secret, claims("c-1", nil)))},
		{"alg RS256, no RSA key configured", "invalid_token", bearer(sign(t, jwt.SigningMethodRS256, rsaKey, claims("c-1", nil)))},
	} {
		for _, route := range routes {
			r := b.do(route.method, route.path, route.body, tc.h)
			unauthorized(t, tc.name+": "+route.method+" "+route.path, r, tc.code)
		}
	}
	if n := b.count("orders"); n != 1 {
		t.Errorf("%d orders, want the 1 created with a valid token", n)
	}
	if got := b.do(http.MethodGet, "/v1/orders/"+order.OrderID, nil, nil); !strings.Contains(string(got.body), `"SUBMITTED"`) {
		t.Errorf("the order changed: %s", got.body)
	}
}

// The probes, the metrics and the API and message documents need no token.
func TestOpenRoutesNeedNoToken(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, path := range []string{"/healthz", "/readyz", "/openapi.yaml", "/asyncapi.yaml", "/ui/login"} {
		if r := b.do(http.MethodGet, path, nil, header{"Authorization": ""}); r.status != http.StatusOK {
			t.Errorf("GET %s without a token: %d", path, r.status)
		}
	}
}

// With API_JWT_ISSUER and API_JWT_AUDIENCE set, a token must name both.
func TestIssuerAndAudience(t *testing.T) {
	t.Parallel()
	var secret = []byte(rand.Text() + rand.Text())
	b := setupWith(t, func(_ *httpapi.Config, d *httpapi.Deps) {
		v, err := auth.NewVerifier(auth.Options{Secret: secret, Issuer: "https://id.example", Audience: "orders"})
		if err != nil {
			t.Fatal(err)
		}
		d.Verifier = v
	})
	mint := func(iss, aud string) header {
		token, err := auth.Mint(secret, auth.Principal{Subject: "ops", Role: auth.RoleOperator}, time.Hour, iss, aud)
		if err != nil {
			t.Fatal(err)
		}
		return bearer(token)
	}
	for _, tc := range []struct{ iss, aud string }{{"", ""}, {"https://other.example", "orders"}, {"https://id.example", "other"}, {"https://id.example", ""}} {
		r := b.do(http.MethodGet, "/v1/orders", nil, mint(tc.iss, tc.aud))
		unauthorized(t, fmt.Sprintf("iss %q aud %q", tc.iss, tc.aud), r, "invalid_token")
	}
	if r := b.do(http.MethodGet, "/v1/orders", nil, mint("https://id.example", "orders")); r.status != http.StatusOK {
		t.Fatalf("the right issuer and audience: %d %s", r.status, r.body)
	}
}

// Tokens of an identity provider, verified with its public keys: each
// algorithm of a configured key, and no other. An HS256 token signed with
// the public key's PEM as its secret (the classic algorithm confusion) is
// refused.
func TestPublicKeyTokens(t *testing.T) {
	t.Parallel()
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	ecKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	var pemKeys bytes.Buffer
	for _, pub := range []any{&rsaKey.PublicKey, &ecKey.PublicKey} {
		der, err := x509.MarshalPKIXPublicKey(pub)
		if err != nil {
			t.Fatal(err)
		}
		_ = pem.Encode(&pemKeys, &pem.Block{Type: "PUBLIC KEY", Bytes: der})
	}
	b := setupWith(t, func(_ *httpapi.Config, d *httpapi.Deps) {
		v, err := auth.NewVerifier(auth.Options{PublicKeysPEM: pemKeys.Bytes(), Audience: "orders-api"})
		if err != nil {
			t.Fatal(err)
		}
		d.Verifier = v
	})
	operator := func(c *auth.Claims) { c.Role, c.Audience = auth.RoleOperator, jwt.ClaimStrings{"orders-api"} }
	for _, tc := range []struct {
		name   string
		token  string
		status int
	}{
		{"RS256", sign(t, jwt.SigningMethodRS256, rsaKey, claims("ops", operator)), http.StatusOK},
		{"RS256 for another client of the provider", sign(t, jwt.SigningMethodRS256, rsaKey, claims("ops", func(c *auth.Claims) {
			c.Role, c.Audience = auth.RoleOperator, jwt.ClaimStrings{"another-app"}
		})), http.StatusUnauthorized},
		{"PS384", sign(t, jwt.SigningMethodPS384, rsaKey, claims("ops", operator)), http.StatusOK},
		{"ES256", sign(t, jwt.SigningMethodES256, ecKey, claims("ops", operator)), http.StatusOK},
		{"HS256 with the public keys as secret", sign(t, jwt.SigningMethodHS256, pemKeys.Bytes(), claims("ops", operator)), http.StatusUnauthorized},
		{"the test bundle's own HS256", b.token("ops", auth.RoleOperator), http.StatusUnauthorized},
	} {
		if r := b.do(http.MethodGet, "/v1/orders", nil, bearer(tc.token)); r.status != tc.status {
			t.Errorf("%s: %d, want %d\n%s", tc.name, r.status, tc.status, r.body)
		}
	}
}

// A valid token whose role is neither customer nor operator is a 403.
func TestUnknownRoleIs403(t *testing.T) {
	t.Parallel()
	b := setup(t)
	admin := bearer(sign(t, jwt.SigningMethodHS256, b.secret, claims("root", func(c *auth.Claims) { c.Role = "admin" })))
	for _, route := range [][2]string{{http.MethodGet, "/v1/orders"}, {http.MethodGet, "/ui/"}} {
		r := b.do(route[0], route[1], nil, admin)
		if r.status != http.StatusForbidden {
			t.Fatalf("%s %s with role admin: %d, want 403\n%s", route[0], route[1], r.status, r.body)
		}
	}
	if r := b.do(http.MethodPost, "/v1/orders", []byte(orderOf("root")), admin); r.status != http.StatusForbidden || r.problem(t).Code != "forbidden" {
		t.Fatalf("POST with role admin: %d %s", r.status, r.body)
	}
	if n := b.count("orders"); n != 0 {
		t.Fatalf("%d orders created", n)
	}
}

// A customer creates its own orders, and no one else's; a token without a
// role is a customer's; an operator creates anyone's.
func TestCustomerCreatesOnlyItsOwnOrders(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if o := b.createOrder(orderOf("alice"), b.as("alice", auth.RoleCustomer)); o.CustomerID != "alice" {
		t.Fatalf("alice's order is %q's", o.CustomerID)
	}
	noRole := bearer(sign(t, jwt.SigningMethodHS256, b.secret, claims("alice", nil)))
	b.createOrder(orderOf("alice"), noRole)
	for _, h := range []header{b.as("alice", auth.RoleCustomer), noRole} {
		r := b.do(http.MethodPost, "/v1/orders", []byte(orderOf("bob")), h)
		if r.status != http.StatusForbidden || r.problem(t).Code != "forbidden" {
			t.Fatalf("alice creating bob's order: %d %s", r.status, r.body)
		}
	}
	b.createOrder(orderOf("bob"), b.as("ops", auth.RoleOperator))
	var n int
	if err := b.pool.QueryRow(t.Context(), `SELECT count(*) FROM orders WHERE customer_id = 'bob'`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("bob has %d orders (%v), want the operator's 1", n, err)
	}
	if n := b.count("message_outbox"); n != 3 {
		t.Fatalf("%d outbox rows, want 3", n)
	}
}

// Another customer's order is a 404 word for word as an unknown id, on GET
// and on cancel, which changes nothing; its owner and an operator see it.
func TestAnotherCustomersOrderIsNotFound(t *testing.T) {
	t.Parallel()
	b := setup(t)
	alice, bob := b.as("alice", auth.RoleCustomer), b.as("bob", auth.RoleCustomer)
	order := b.createOrder(orderOf("alice"), alice)
	unknown := "0190a7b0-0000-7000-8000-000000000000"

	strip := func(r response) string { // the problem without the parts that differ per request
		var p map[string]any
		r.decode(t, &p)
		delete(p, "correlation_id")
		delete(p, "instance")
		out, _ := json.Marshal(p)
		return fmt.Sprint(r.status, " ", string(out))
	}
	for _, op := range []struct{ method, suffix string }{{http.MethodGet, ""}, {http.MethodPost, "/cancel"}} {
		hidden := b.do(op.method, "/v1/orders/"+order.OrderID+op.suffix, nil, bob)
		missing := b.do(op.method, "/v1/orders/"+unknown+op.suffix, nil, bob)
		if hidden.status != http.StatusNotFound || strip(hidden) != strip(missing) {
			t.Errorf("%s another's order: %s\nunknown id: %s", op.method+op.suffix, strip(hidden), strip(missing))
		}
	}
	if got := b.do(http.MethodGet, "/v1/orders/"+order.OrderID, nil, alice); got.status != http.StatusOK || !strings.Contains(string(got.body), `"status":"SUBMITTED"`) {
		t.Fatalf("alice reads her order: %d %s", got.status, got.body)
	}
	if got := b.do(http.MethodPost, "/v1/orders/"+order.OrderID+"/cancel", nil, alice); got.status != http.StatusOK {
		t.Fatalf("alice cancels her order: %d %s", got.status, got.body)
	}
	other := b.createOrder(orderOf("bob"), bob)
	if got := b.do(http.MethodPost, "/v1/orders/"+other.OrderID+"/cancel", nil, b.as("ops", auth.RoleOperator)); got.status != http.StatusOK {
		t.Fatalf("an operator cancels bob's order: %d %s", got.status, got.body)
	}
	var cancelled int
	if err := b.pool.QueryRow(t.Context(), `SELECT count(*) FROM message_outbox WHERE message_type = 'order.cancelled'`).Scan(&cancelled); err != nil || cancelled != 2 {
		t.Fatalf("%d order.cancelled messages (%v), want 2: alice's and the operator's", cancelled, err)
	}
}

// The list is the caller's: a customer walks every page of its own orders
// and only those; a customer_id filter of another customer finds none; an
// operator sees everyone's.
func TestListIsTheCallers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	operator := b.as("ops", auth.RoleOperator)
	mine := map[string]bool{}
	for i := range 12 { // interleaved, so that a page of everyone's orders would mix them
		who := []string{"alice", "bob", "carol"}[i%3]
		o := b.createOrder(orderOf(who), operator)
		if who == "alice" {
			mine[o.OrderID] = true
		}
	}
	walk := func(h header, query string) []string {
		var ids []string
		after := ""
		for range 20 {
			q := url.Values{"limit": {"3"}}
			if query != "" {
				q.Set("customer_id", query)
			}
			if after != "" {
				q.Set("after", after)
			}
			r := b.do(http.MethodGet, "/v1/orders?"+q.Encode(), nil, h)
			if r.status != http.StatusOK {
				t.Fatalf("list: %d %s", r.status, r.body)
			}
			var page struct {
				Orders     []orderBody `json:"orders"`
				NextCursor *string     `json:"next_cursor"`
			}
			r.decode(t, &page)
			for _, o := range page.Orders {
				ids = append(ids, o.OrderID)
			}
			if page.NextCursor == nil {
				return ids
			}
			after = *page.NextCursor
		}
		t.Fatal("the pages never end")
		return nil
	}
	alice := b.as("alice", auth.RoleCustomer)
	for _, query := range []string{"", "alice"} {
		got := walk(alice, query)
		seen := map[string]bool{}
		for _, id := range got {
			if !mine[id] || seen[id] {
				t.Errorf("customer_id=%q: alice's list has %s (hers: %v, seen before: %v)", query, id, mine[id], seen[id])
			}
			seen[id] = true
		}
		if len(seen) != len(mine) {
			t.Errorf("customer_id=%q: alice's list has %d of her %d orders", query, len(seen), len(mine))
		}
	}
	if got := walk(alice, "bob"); len(got) != 0 {
		t.Errorf("alice filtering on bob sees %d orders", len(got))
	}
	if got := walk(operator, ""); len(got) != 12 {
		t.Errorf("the operator sees %d orders, want 12", len(got))
	}
	if got := walk(operator, "bob"); len(got) != 4 {
		t.Errorf("the operator filtering on bob sees %d orders, want 4", len(got))
	}
}

// An Idempotency-Key is its caller's: bob sending alice's key gets no
// replay of alice's response (her order), with his body or with hers.
func TestIdempotencyKeyOfAnotherCustomerIsNoReplay(t *testing.T) {
	t.Parallel()
	b := setup(t)
	alice, bob := b.as("alice", auth.RoleCustomer), b.as("bob", auth.RoleCustomer)
	withKey := func(h header) header {
		h[httpapi.HeaderIdempotencyKey] = "key-1"
		return h
	}
	first := b.createOrder(orderOf("alice"), withKey(alice))

	// bob, alice's key, alice's body: not her response, a 403.
	r := b.do(http.MethodPost, "/v1/orders", []byte(orderOf("alice")), withKey(b.as("bob", auth.RoleCustomer)))
	if r.status != http.StatusForbidden || strings.Contains(string(r.body), first.OrderID) {
		t.Fatalf("bob replaying alice's key and body: %d %s", r.status, r.body)
	}
	// bob, alice's key, his own body: a new order of his.
	r = b.do(http.MethodPost, "/v1/orders", []byte(orderOf("bob")), withKey(bob))
	if r.status != http.StatusCreated || r.header.Get(httpapi.HeaderIdempotentReplayed) != "" {
		t.Fatalf("bob with alice's key: %d %v %s", r.status, r.header, r.body)
	}
	var his orderBody
	r.decode(t, &his)
	if his.OrderID == first.OrderID || his.CustomerID != "bob" {
		t.Fatalf("bob got %+v", his)
	}
	// Each replays his own.
	for who, want := range map[string]string{"alice": first.OrderID, "bob": his.OrderID} {
		r := b.do(http.MethodPost, "/v1/orders", []byte(orderOf(who)), withKey(b.as(who, auth.RoleCustomer)))
		if r.status != http.StatusCreated || r.header.Get(httpapi.HeaderIdempotentReplayed) != "true" || !strings.Contains(string(r.body), want) {
			t.Errorf("%s's replay: %d %s, want %s", who, r.status, r.body, want)
		}
	}
	if n := b.count("orders"); n != 2 {
		t.Fatalf("%d orders, want 2", n)
	}
}

// A customer and an operator whose tokens name the same sub are two
// callers: the operator's request with the customer's key is a new order,
// never the customer's stored response, and each replays its own.
func TestIdempotencyKeyOfAnotherRoleIsNoReplay(t *testing.T) {
	t.Parallel()
	b := setup(t)
	withKey := func(h header) header {
		h[httpapi.HeaderIdempotencyKey] = "key-1"
		return h
	}
	customer := b.createOrder(orderOf("alice"), withKey(b.as("alice", auth.RoleCustomer)))
	r := b.do(http.MethodPost, "/v1/orders", []byte(orderOf("alice")), withKey(b.as("alice", auth.RoleOperator)))
	if r.status != http.StatusCreated || r.header.Get(httpapi.HeaderIdempotentReplayed) != "" {
		t.Fatalf("operator alice with customer alice's key and body: %d %v %s, want a new order", r.status, r.header, r.body)
	}
	var operator orderBody
	r.decode(t, &operator)
	if operator.OrderID == customer.OrderID {
		t.Fatalf("operator alice got customer alice's order %s", customer.OrderID)
	}
	for role, want := range map[auth.Role]string{auth.RoleCustomer: customer.OrderID, auth.RoleOperator: operator.OrderID} {
		r := b.do(http.MethodPost, "/v1/orders", []byte(orderOf("alice")), withKey(b.as("alice", role)))
		if r.status != http.StatusCreated || r.header.Get(httpapi.HeaderIdempotentReplayed) != "true" || !strings.Contains(string(r.body), want) {
			t.Errorf("the %s's replay: %d %s, want %s", role, r.status, r.body, want)
		}
	}
	if n := b.count("orders"); n != 2 {
		t.Fatalf("%d orders, want 2", n)
	}
}

// syncBuffer is a log the API writes from its handlers' goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}

// Each refusal is counted by reason on /metrics and logged with its reason
// and correlation id, never with the token. Another customer's order is
// not counted: /metrics is open, and would tell that the order exists.
func TestRefusalsAreCountedAndLogged(t *testing.T) {
	t.Parallel()
	tel, err := telemetry.Setup(t.Context(), "order-api",
		config.Telemetry{TracesExporter: "none", LogsExporter: "none", OTLPProtocol: "http/protobuf"},
		config.Log{Level: "info", Format: "json"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tel.Shutdown(t.Context()) })
	var logs syncBuffer
	b := setupWith(t, func(_ *httpapi.Config, d *httpapi.Deps) {
		d.MeterProvider, d.MetricsHandler = tel.MeterProvider, tel.MetricsHandler
		d.Logger = telemetry.NewLogger("order-api", config.Log{Level: "info", Format: "json"}, &logs)
	})
	order := b.createOrder(orderOf("alice"), nil)
	expired := sign(t, jwt.SigningMethodHS256, b.secret, claims("alice", func(c *auth.Claims) {
		c.ExpiresAt = jwt.NewNumericDate(time.Now().Add(-time.Hour))
	}))
	h := bearer(expired)
	h[httpapi.HeaderCorrelationID] = "corr-expired"
	b.do(http.MethodGet, "/v1/orders", nil, h)
	b.do(http.MethodGet, "/v1/orders", nil, header{"Authorization": ""})
	b.do(http.MethodGet, "/v1/orders", nil, header{"Authorization": ""})
	b.do(http.MethodPost, "/v1/orders", []byte(orderOf("bob")), b.as("alice", auth.RoleCustomer))
	b.do(http.MethodGet, "/v1/orders/"+order.OrderID, nil, b.as("bob", auth.RoleCustomer))

	metrics := string(b.do(http.MethodGet, "/metrics", nil, nil).body)
	counts := map[string]string{}
	for line := range strings.Lines(metrics) {
		if strings.HasPrefix(line, "http_auth_refusals_total{") {
			_, after, _ := strings.Cut(line, `reason="`)
			reason, _, _ := strings.Cut(after, `"`)
			counts[reason] = strings.TrimSpace(line[strings.LastIndexByte(line, ' '):])
		}
	}
	want := map[string]string{"expired": "1", "missing": "2", "other_customer": "1"}
	for _, reason := range auth.Reasons { // every series is there from the start
		if want[reason] == "" {
			want[reason] = "0"
		}
	}
	if fmt.Sprint(counts) != fmt.Sprint(want) {
		t.Errorf("http_auth_refusals_total by reason: %v, want %v", counts, want)
	}
	var found bool
	for line := range strings.Lines(logs.String()) {
		if strings.Contains(line, expired) || strings.Contains(line, strings.Split(expired, ".")[2]) {
			t.Errorf("a log line carries the token: %s", line)
		}
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) == nil && rec["msg"] == "request refused" && rec["reason"] == "expired" {
			found = rec["correlation_id"] == "corr-expired" && rec["level"] == "INFO"
		}
	}
	if !found {
		t.Errorf("no INFO line \"request refused\" with reason expired and correlation_id corr-expired:\n%s", logs.String())
	}
}

// postForm sends a form to the server at base (the bundle's unless
// another) without following the redirect it answers with; the exchange is
// checked against api/openapi.yaml.
func (b *testBundle) postForm(base, path string, form url.Values, h header) response {
	b.t.Helper()
	req, err := http.NewRequestWithContext(b.t.Context(), http.MethodPost, base+path, strings.NewReader(form.Encode()))
	if err != nil {
		b.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for k, v := range h {
		req.Header.Set(k, v)
	}
	var transport http.RoundTripper
	if strings.HasPrefix(base, "https:") {
		transport = &http.Transport{TLSClientConfig: b.tlsConfig}
	}
	client := &http.Client{
		Transport:     apicheck.Transport(b.t, transport),
		Timeout:       time.Minute,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	resp, err := client.Do(req)
	if err != nil {
		b.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return response{status: resp.StatusCode, header: resp.Header, body: body}
}

// signInCookie is the cookie a 303 of POST /ui/login sets.
func signInCookie(t *testing.T, r response) *http.Cookie {
	t.Helper()
	if r.status != http.StatusSeeOther {
		t.Fatalf("POST /ui/login: %d, want 303\n%s", r.status, r.body)
	}
	for _, c := range (&http.Response{Header: r.header}).Cookies() {
		if c.Name == "orders_ui_token" {
			return c
		}
	}
	t.Fatalf("POST /ui/login set no cookie: %v", r.header)
	return nil
}

// A browser signs in at /ui/login: the token becomes an HttpOnly,
// SameSite=Strict cookie for /ui (Secure over TLS, until the token
// expires), which the pages take and /v1/ does not; the pages then show a
// customer its own orders only. Sign-in forms from another origin, and
// tokens that do not verify, set nothing; /ui/logout clears the cookie.
func TestUISignInAndFiltering(t *testing.T) {
	t.Parallel()
	b := setup(t)
	operator := b.as("ops", auth.RoleOperator)
	hers := b.createOrder(orderOf("alice"), operator)
	his := b.createOrder(orderOf("bob"), operator)
	sameOrigin := header{"Sec-Fetch-Site": "same-origin", "Origin": b.server.URL}

	// Not signed in: a 401 page that leads to the sign-in form.
	r := b.do(http.MethodGet, "/ui/", nil, header{"Authorization": ""})
	if r.status != http.StatusUnauthorized || r.header.Get("WWW-Authenticate") != "Bearer" ||
		!strings.HasPrefix(r.header.Get("Content-Type"), "text/html") || !strings.Contains(string(r.body), `href="/ui/login"`) {
		t.Fatalf("GET /ui/ without a token: %d %v\n%s", r.status, r.header, r.body)
	}
	if page := b.page("/ui/login", http.StatusOK); !strings.Contains(page, `<form class="login" method="post" action="/ui/login">`) {
		t.Fatalf("the sign-in page has no form:\n%s", page)
	}

	// Signed in as alice.
	token := b.token("alice", auth.RoleCustomer)
	cookie := signInCookie(t, b.postForm(b.server.URL, "/ui/login", url.Values{"token": {token}}, sameOrigin))
	if cookie.Value != token || cookie.Path != "/ui" || !cookie.HttpOnly || cookie.SameSite != http.SameSiteStrictMode || cookie.Secure {
		t.Errorf("cookie %+v", cookie)
	}
	if until := time.Until(cookie.Expires); until < 50*time.Minute || until > time.Hour+time.Minute {
		t.Errorf("the cookie expires in %v, want with the token (an hour)", until)
	}
	asAlice := header{"Authorization": "", "Cookie": cookie.String()}
	r = b.do(http.MethodGet, "/ui/", nil, asAlice)
	list := string(r.body)
	if r.status != http.StatusOK || !strings.Contains(list, hers.OrderID) || strings.Contains(list, his.OrderID) || len(orderRow.FindAllString(list, -1)) != 1 {
		t.Fatalf("alice's /ui/: %d, want her order only\n%s", r.status, list)
	}
	if !strings.Contains(list, `<span class="mono">alice</span> (customer)`) {
		t.Errorf("the page does not say who is signed in:\n%s", list)
	}
	if r = b.do(http.MethodGet, "/ui/?customer_id=bob", nil, asAlice); r.status != http.StatusOK || strings.Contains(string(r.body), his.OrderID) {
		t.Errorf("alice's /ui/?customer_id=bob shows bob's order: %d", r.status)
	}
	if r = b.do(http.MethodGet, "/ui/orders/"+hers.OrderID, nil, asAlice); r.status != http.StatusOK {
		t.Errorf("alice's order page: %d", r.status)
	}
	hidden := b.do(http.MethodGet, "/ui/orders/"+his.OrderID, nil, asAlice)
	missing := b.do(http.MethodGet, "/ui/orders/0190a7b0-0000-7000-8000-000000000000", nil, asAlice)
	if hidden.status != http.StatusNotFound || strings.Contains(string(hidden.body), "bob") || missing.status != http.StatusNotFound {
		t.Errorf("bob's order page for alice: %d, an unknown one: %d\n%s", hidden.status, missing.status, hidden.body)
	}
	// The cookie is for the pages only: /v1/ needs the header.
	unauthorized(t, "GET /v1/orders with the cookie", b.do(http.MethodGet, "/v1/orders", nil, asAlice), "unauthenticated")

	// Refused sign-ins set no cookie.
	for name, tc := range map[string]struct {
		h      header
		token  string
		status int
	}{
		"from another site":   {header{"Sec-Fetch-Site": "cross-site"}, token, http.StatusForbidden},
		"from another origin": {header{"Origin": "https://evil.example"}, token, http.StatusForbidden},
		"an expired token": {sameOrigin, sign(t, jwt.SigningMethodHS256, b.secret, claims("alice", func(c *auth.Claims) {
			c.ExpiresAt = jwt.NewNumericDate(time.Now().Add(-time.Hour))
		})), http.StatusUnauthorized},
		"no token": {sameOrigin, "", http.StatusUnauthorized},
	} {
		r := b.postForm(b.server.URL, "/ui/login", url.Values{"token": {tc.token}}, tc.h)
		if r.status != tc.status || r.header.Get("Set-Cookie") != "" || !strings.HasPrefix(r.header.Get("Content-Type"), "text/html") {
			t.Errorf("sign-in %s: %d %v, want %d and no cookie", name, r.status, r.header, tc.status)
		}
	}

	// Sign out.
	r = b.postForm(b.server.URL, "/ui/logout", nil, sameOrigin)
	cleared := signInCookie(t, r)
	if cleared.MaxAge >= 0 || cleared.Value != "" || cleared.Path != "/ui" || r.header.Get("Location") != "/ui/login" {
		t.Errorf("sign-out: cookie %+v, Location %q", cleared, r.header.Get("Location"))
	}

	// Over TLS the cookie is Secure.
	tlsServer := httptest.NewTLSServer(b.handler)
	t.Cleanup(tlsServer.Close)
	b.tlsConfig = tlsServer.Client().Transport.(*http.Transport).TLSClientConfig
	secure := signInCookie(t, b.postForm(tlsServer.URL, "/ui/login", url.Values{"token": {token}}, header{"Sec-Fetch-Site": "same-origin"}))
	if !secure.Secure {
		t.Errorf("the cookie set over TLS is not Secure: %+v", secure)
	}
}
