package e2e

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/yourorg/orders/internal/auth"
)

// order-api as a process, configured as it is deployed (JWT tokens, its
// own database role), answers what a client gets wrong as api/openapi.yaml
// says, and what it gets right too: every exchange below goes through
// s.client, which checks it against the document (apicheck), and each
// status is the one the document gives for the case.
func TestAPIProcessAnswersAsTheDocumentSays(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	s.startAPI()
	customer, err := auth.Mint([]byte(s.secret), auth.Principal{Subject: "c-1", Role: auth.RoleCustomer}, time.Hour, "", "")
	if err != nil {
		t.Fatal(err)
	}
	code, created := s.post("/v1/orders", map[string]any{"customer_id": "c-1", "currency": "EUR",
		"items": []map[string]any{{"sku": "A-1", "quantity": 1, "unit_price_cents": 500}}})
	if code != http.StatusCreated {
		t.Fatalf("create: %d", code)
	}
	id := created["order_id"].(string)
	const order = `{"customer_id":"c-1","currency":"EUR","items":[{"sku":"A-1","quantity":1,"unit_price_cents":500}]}`
	operator := "Bearer " + s.token
	for _, tc := range []struct {
		name, method, path, body string
		header                   map[string]string
		want                     int
	}{
		{"health", http.MethodGet, "/healthz", "", nil, 200},
		{"readiness", http.MethodGet, "/readyz", "", nil, 200},
		{"metrics", http.MethodGet, "/metrics", "", nil, 200},
		{"the document", http.MethodGet, "/openapi.yaml", "", nil, 200},
		{"the messages' document", http.MethodGet, "/asyncapi.yaml", "", nil, 200},
		{"list", http.MethodGet, "/v1/orders?limit=1&status=SUBMITTED", "", map[string]string{"Authorization": operator}, 200},
		{"read", http.MethodGet, "/v1/orders/" + id, "", map[string]string{"Authorization": operator}, 200},
		{"create, with a key", http.MethodPost, "/v1/orders", order, map[string]string{"Authorization": operator, "Idempotency-Key": "k-1"}, 201},
		{"the same key again", http.MethodPost, "/v1/orders", order, map[string]string{"Authorization": operator, "Idempotency-Key": "k-1"}, 201},
		{"the same key, another body", http.MethodPost, "/v1/orders", strings.Replace(order, "A-1", "B-1", 1), map[string]string{"Authorization": operator, "Idempotency-Key": "k-1"}, 422},
		{"a key that is not ASCII", http.MethodPost, "/v1/orders", order, map[string]string{"Authorization": operator, "Idempotency-Key": "clé"}, 400},
		{"no token", http.MethodPost, "/v1/orders", order, nil, 401},
		{"a token that is not one", http.MethodGet, "/v1/orders", "", map[string]string{"Authorization": "Bearer not-a-jwt"}, 401},
		{"another customer's order", http.MethodPost, "/v1/orders", strings.Replace(order, "c-1", "c-2", 1), map[string]string{"Authorization": "Bearer " + customer}, 403},
		{"malformed JSON", http.MethodPost, "/v1/orders", `{"customer_id":`, map[string]string{"Authorization": operator}, 400},
		{"an unknown field", http.MethodPost, "/v1/orders", strings.Replace(order, "customer_id", "Customer_ID", 1), map[string]string{"Authorization": operator}, 400},
		{"not JSON", http.MethodPost, "/v1/orders", order, map[string]string{"Authorization": operator, "Content-Type": "text/plain"}, 415},
		{"an order that breaks the rules", http.MethodPost, "/v1/orders", `{"customer_id":"c-1","currency":"euro","items":[{"sku":"A-1","quantity":0,"unit_price_cents":1}]}`, map[string]string{"Authorization": operator}, 422},
		{"too large", http.MethodPost, "/v1/orders", `{"customer_id":"` + strings.Repeat("x", 70<<10) + `"}`, map[string]string{"Authorization": operator}, 413},
		{"an unlisted query parameter", http.MethodGet, "/v1/orders?colour=red", "", map[string]string{"Authorization": operator}, 400},
		{"a limit out of range", http.MethodGet, "/v1/orders?limit=0", "", map[string]string{"Authorization": operator}, 400},
		{"an unknown order", http.MethodGet, "/v1/orders/" + uuid.NewString(), "", map[string]string{"Authorization": operator}, 404},
		{"a malformed id", http.MethodGet, "/v1/orders/not-an-id", "", map[string]string{"Authorization": operator}, 404},
		{"cancel", http.MethodPost, "/v1/orders/" + id + "/cancel", "", map[string]string{"Authorization": operator}, 200},
		{"cancel again", http.MethodPost, "/v1/orders/" + id + "/cancel", "", map[string]string{"Authorization": operator}, 200},
		{"no such path", http.MethodGet, "/v2/orders", "", map[string]string{"Authorization": operator}, 404},
		{"no such method", http.MethodDelete, "/v1/orders/" + id, "", map[string]string{"Authorization": operator}, 405},
		{"the pages", http.MethodGet, "/ui/?status=CANCELLED", "", map[string]string{"Authorization": operator}, 200},
		{"a page", http.MethodGet, "/ui/orders/" + id, "", map[string]string{"Authorization": operator}, 200},
		{"the pages, signed out", http.MethodGet, "/ui/", "", nil, 401},
		{"the sign-in page", http.MethodGet, "/ui/login", "", nil, 200},
	} {
		var body io.Reader = http.NoBody
		if tc.body != "" {
			body = strings.NewReader(tc.body)
		}
		req, err := http.NewRequestWithContext(t.Context(), tc.method, s.apiURL+tc.path, body)
		if err != nil {
			t.Fatal(err)
		}
		if tc.body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		for k, v := range tc.header {
			req.Header.Set(k, v)
		}
		resp, err := s.client.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("%s: %s %s -> %d, want %d\n%.300s", tc.name, tc.method, tc.path, resp.StatusCode, tc.want, got)
		}
	}
	s.stop("order-api")
}
