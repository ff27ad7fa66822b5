package apicheck_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/yourorg/orders/api/apicheck"
)

const (
	orderID = "0193a3c4-2f6e-7d1a-9b3c-4d5e6f708190"
	order   = `{"order_id":"` + orderID + `","customer_id":"c-1","status":"SUBMITTED","version":1,"currency":"EUR",` +
		`"total_cents":500,"items":[{"sku":"A-1","quantity":1,"unit_price_cents":500}],` +
		`"created_at":"2025-01-01T00:00:00Z","updated_at":"2025-01-01T00:00:00Z",` +
		`"history":[{"from_status":"","to_status":"SUBMITTED","message_id":null,"correlation_id":"corr-1","created_at":"2025-01-01T00:00:00Z"}]}`
	newOrder = `{"customer_id":"c-1","currency":"EUR","items":[{"sku":"A-1","quantity":1,"unit_price_cents":500}]}`
	problem  = `{"type":"about:blank","title":"Not Found","status":404,"code":"not_found","correlation_id":"corr-1"}`
)

// exchange is one request and the answer a made-up server gives it.
type exchange struct {
	method, path, body string
	header             map[string]string // of the request
	status             int
	respHeader         map[string]string
	respBody           string
}

func (x exchange) check(t *testing.T) error {
	t.Helper()
	req := httptest.NewRequest(x.method, "http://api.test"+x.path, strings.NewReader(x.body))
	for k, v := range x.header {
		req.Header.Set(k, v)
	}
	resp := &http.Response{StatusCode: x.status, Header: http.Header{}}
	resp.Header.Set("X-Correlation-ID", "corr-1")
	for k, v := range x.respHeader {
		if v == "" {
			resp.Header.Del(k)
		} else {
			resp.Header.Set(k, v)
		}
	}
	return apicheck.Check(req, []byte(x.body), resp, []byte(x.respBody))
}

var (
	bearer    = map[string]string{"Authorization": "Bearer t"}
	json      = map[string]string{"Content-Type": "application/json"}
	problemCT = map[string]string{"Content-Type": "application/problem+json"}
)

func with(a, b map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		out[k] = v
	}
	return out
}

// The exchanges the document describes pass.
func TestDocumentedExchangesPass(t *testing.T) {
	t.Parallel()
	for name, x := range map[string]exchange{
		"create": {http.MethodPost, "/v1/orders", newOrder, with(bearer, json), 201,
			with(json, map[string]string{"Location": "/v1/orders/" + orderID}), order},
		"no token, 401": {http.MethodPost, "/v1/orders", newOrder, json, 401,
			with(problemCT, map[string]string{"WWW-Authenticate": "Bearer"}),
			`{"type":"about:blank","title":"Unauthorized","status":401,"code":"unauthenticated"}`},
		"a bad body, 400": {http.MethodPost, "/v1/orders", `{"customer_id":`, with(bearer, json), 400, problemCT,
			`{"type":"about:blank","title":"Bad Request","status":400,"code":"malformed_json"}`},
		"an unlisted query parameter, 400": {http.MethodGet, "/v1/orders?colour=red", "", bearer, 400, problemCT,
			`{"type":"about:blank","title":"Bad Request","status":400,"code":"invalid_query"}`},
		"overloaded, 503": {http.MethodGet, "/v1/orders/" + orderID, "", bearer, 503,
			with(problemCT, map[string]string{"Retry-After": "1"}),
			`{"type":"about:blank","title":"Service Unavailable","status":503,"code":"overloaded"}`},
		"no such path, 404": {http.MethodGet, "/v2/orders", "", bearer, 404, problemCT, problem},
		"the pages, by cookie": {http.MethodGet, "/ui/", "", map[string]string{"Cookie": "orders_ui_token=t"}, 200,
			map[string]string{"Content-Type": "text/html; charset=UTF-8"}, "<!doctype html>"},
	} {
		if err := x.check(t); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// Each exchange that departs from the document fails, with a message that
// names the operation and the status.
func TestUndocumentedExchangesFail(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		x    exchange
		want string
	}{
		"a body without a required field": {exchange{http.MethodGet, "/v1/orders/" + orderID, "", bearer, 200, json,
			strings.Replace(order, `"currency":"EUR",`, "", 1)}, "getOrder (GET /v1/orders/" + orderID + ") -> 200"},
		"a status the operation does not have": {exchange{http.MethodGet, "/v1/orders/" + orderID, "", bearer, 418, problemCT,
			problem}, "status is not supported"},
		"a 201 without Location": {exchange{http.MethodPost, "/v1/orders", newOrder, with(bearer, json), 201, json, order},
			`"Location"`},
		"a 503 without Retry-After": {exchange{http.MethodGet, "/v1/orders/" + orderID, "", bearer, 503, problemCT,
			`{"type":"about:blank","title":"Service Unavailable","status":503,"code":"overloaded"}`}, `"Retry-After"`},
		"a problem with an unknown code": {exchange{http.MethodGet, "/v1/orders/" + orderID, "", bearer, 404, problemCT,
			strings.Replace(problem, "not_found", "gone", 1)}, `Error at "/code"`},
		"an answer without a correlation id": {exchange{http.MethodGet, "/healthz", "", nil, 200,
			with(json, map[string]string{"X-Correlation-ID": ""}), `{"status":"ok"}`}, "X-Correlation-ID"},
		"no token, yet served": {exchange{http.MethodPost, "/v1/orders", newOrder, json, 201,
			with(json, map[string]string{"Location": "/v1/orders/" + orderID}), order}, "not 401"},
		"a bad body, yet served": {exchange{http.MethodPost, "/v1/orders", `{"customer_id":"c-1"}`, with(bearer, json), 201,
			with(json, map[string]string{"Location": "/v1/orders/" + orderID}), order}, "not a 4XX"},
		"an unlisted query parameter, yet served": {exchange{http.MethodGet, "/v1/orders?colour=red", "", bearer, 200, json,
			`{"orders":[],"next_cursor":null}`}, `query parameter "colour"`},
		"a path the document does not have, yet served": {exchange{http.MethodGet, "/v2/orders", "", bearer, 200, json,
			`{}`}, "not a 404 or 405"},
		"a 404 of no route that is not a problem": {exchange{http.MethodGet, "/v2/orders", "", bearer, 404,
			map[string]string{"Content-Type": "text/plain"}, "404 page not found"}, "want application/problem+json"},
	} {
		err := tc.x.check(t)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error with %q", name, err, tc.want)
		}
	}
}

// Through Transport, a mismatch fails the test that sent the request; the
// caller still gets the answer as the server sent it.
func TestTransportFailsTheTest(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("X-Correlation-ID", "corr-1")
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"status":42}`))
	}))
	t.Cleanup(srv.Close)

	rec := &recorder{TB: t}
	client := &http.Client{Transport: apicheck.Transport(rec, nil)}
	resp, err := client.Get(srv.URL + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d, want the server's 200", resp.StatusCode)
	}
	if len(rec.errors) != 1 || !strings.Contains(rec.errors[0], "healthz (GET /healthz) -> 200") {
		t.Fatalf("errors %q, want one naming healthz (GET /healthz) -> 200", rec.errors)
	}
}

// recorder is a testing.TB that keeps the errors reported to it.
type recorder struct {
	testing.TB
	errors []string
}

func (r *recorder) Errorf(format string, args ...any) {
	r.errors = append(r.errors, fmt.Sprintf(format, args...))
}
