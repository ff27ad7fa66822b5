package httpapi_test

import (
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"

	"github.com/yourorg/orders/internal/auth"
	"github.com/yourorg/orders/internal/domain"
	"github.com/yourorg/orders/internal/httpapi"
	"github.com/yourorg/orders/internal/store"
)

func init() {
	// As telemetry.Setup does in each binary: W3C trace context and
	// baggage, which the outbox rows carry.
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
}

// page gets a page of /ui/ and checks that it is HTML under the page's
// content security policy.
func (b *testBundle) page(path string, wantStatus int) string {
	b.t.Helper()
	r := b.do(http.MethodGet, path, nil, nil)
	if r.status != wantStatus {
		b.t.Fatalf("GET %s: %d, want %d\n%s", path, r.status, wantStatus, r.body)
	}
	if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, "text/html") {
		b.t.Fatalf("GET %s: Content-Type %q, want text/html", path, ct)
	}
	if csp := r.header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") {
		b.t.Fatalf("GET %s: Content-Security-Policy %q", path, csp)
	}
	return string(r.body)
}

var orderRow = regexp.MustCompile(`<tr class="order">`)

// The timeline of an order created and cancelled through the API: every
// hop the database holds, with every value escaped, and the trace linked
// to Jaeger.
func TestUIOrderTimeline(t *testing.T) {
	t.Parallel()
	b := setupWith(t, func(c *httpapi.Config, _ *httpapi.Deps) { c.JaegerUIURL = "http://jaeger.test:16686/" })
	// The test's tracer is a no-op, which keeps the caller's span context:
	// so the caller picks the trace id here. The API's own tracer starts a
	// trace of its own (TestCallersTraceIsLinkedNotContinued).
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	o := b.createOrder(`{"customer_id":"<script>alert(1)</script>","currency":"EUR","items":[{"sku":"A-1","quantity":2,"unit_price_cents":1250}]}`,
		header{"traceparent": "00-" + traceID + "-00f067aa0ba902b7-01", httpapi.HeaderCorrelationID: "corr-ui"})
	if r := b.do(http.MethodPost, "/v1/orders/"+o.OrderID+"/cancel", nil, nil); r.status != http.StatusOK {
		t.Fatalf("cancel: %d %s", r.status, r.body)
	}

	body := b.page("/ui/orders/"+o.OrderID, http.StatusOK)
	for _, want := range []string{
		`<span class="status status-CANCELLED" id="order-status">CANCELLED</span>`,
		"order created: SUBMITTED",
		"SUBMITTED → CANCELLED (HTTP request)",
		"order.submitted not published yet: PENDING",
		"order.cancelled not published yet: PENDING",
		"corr-ui",
		"25.00 EUR",
		"2 × A-1",
		`<a class="mono" href="http://jaeger.test:16686/trace/` + traceID + `">` + traceID + `</a>`,
		"&lt;script&gt;alert(1)&lt;/script&gt;",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("the page has no %q", want)
		}
	}
	if strings.Contains(body, "<script>") {
		t.Errorf("the customer id reached the page unescaped")
	}
	// The hops in time order, the messages still waiting for the relay last.
	var at []int
	for _, s := range []string{"order created: SUBMITTED", "SUBMITTED → CANCELLED", "order.submitted not published yet", "order.cancelled not published yet"} {
		at = append(at, strings.Index(body, s))
	}
	if !slices.IsSorted(at) {
		t.Errorf("the hops are not in order: created, cancelled, then the two waiting messages (at %v)", at)
	}
}

// A rejected order's page says why at its top, and on the rejection's
// hop: the reason the consumer recorded, naming the sku.
func TestUIRejectedOrderSaysWhy(t *testing.T) {
	t.Parallel()
	b := setup(t)
	o := b.createOrder(strings.Replace(validOrder, "A-1", "OOS-1", 1), nil)
	id := uuid.MustParse(o.OrderID)
	for _, step := range []struct {
		trigger domain.Trigger
		reason  string
	}{{domain.TriggerSubmitted, ""}, {domain.TriggerFulfillmentRejected, "out of stock: OOS-1"}} {
		cause := domain.Cause{MessageID: uuid.NewString(), CorrelationID: "corr-oos"}
		if _, _, err := store.MoveOrderBecause(t.Context(), b.pool, id, step.trigger, cause, step.reason); err != nil {
			t.Fatal(err)
		}
	}
	body := b.page("/ui/orders/"+o.OrderID, http.StatusOK)
	for _, want := range []string{
		`<p class="reason" id="journey-reason">Why REJECTED: out of stock: OOS-1</p>`,
		"FULFILLMENT_REQUESTED → REJECTED on a message: out of stock: OOS-1",
		`<dt>reason</dt><dd class="mono">out of stock: OOS-1</dd>`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("the page has no %q", want)
		}
	}
	if n := strings.Count(body, " status-change"); n != 3 {
		t.Errorf("%d hops marked as status changes, want the 3 transitions", n)
	}
}

// The list says who is signed in and what the role lets them see: an
// operator (a development token of orderctl token -operator says so in
// its sub) every order, a customer its own.
func TestUIOrdersSaysTheCallersRole(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, tc := range []struct {
		sub  string
		role auth.Role
		want string
	}{
		{"dev-operator:tester", auth.RoleOperator, `Signed in as <span class="mono">dev-operator:tester</span> (operator): every order.`},
		{"c-1", auth.RoleCustomer, `Signed in as <span class="mono">c-1</span> (customer): your orders only.`},
	} {
		r := b.do(http.MethodGet, "/ui/", nil, b.as(tc.sub, tc.role))
		if r.status != http.StatusOK || !strings.Contains(string(r.body), tc.want) {
			t.Errorf("/ui/ as %s (%s): %d, want %q in\n%s", tc.sub, tc.role, r.status, tc.want, r.body)
		}
	}
}

// Without JAEGER_UI_URL the trace id is shown, not linked.
func TestUIOrderTraceWithoutJaeger(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const traceID = "0af7651916cd43dd8448eb211c80319c"
	o := b.createOrder(validOrder, header{"traceparent": "00-" + traceID + "-b7ad6b7169203331-01"})
	body := b.page("/ui/orders/"+o.OrderID, http.StatusOK)
	if !strings.Contains(body, `<span class="mono">`+traceID+`</span>`) || strings.Contains(body, "/trace/") {
		t.Errorf("the trace is not shown unlinked:\n%s", body)
	}
	if !strings.Contains(body, "set JAEGER_UI_URL") {
		t.Errorf("the page does not say how to link the trace")
	}
}

// An unknown or malformed order id, an unknown page, a bad filter: an HTML
// page with the status, never problem+json.
func TestUIErrorsArePages(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for path, status := range map[string]int{
		"/ui/orders/" + uuid.NewString(): http.StatusNotFound,
		"/ui/orders/not-an-id":           http.StatusNotFound,
		"/ui/nothing-here":               http.StatusNotFound,
		"/ui/?status=LOST":               http.StatusBadRequest,
		"/ui/?limit=5":                   http.StatusBadRequest,
		"/ui/?after=nonsense":            http.StatusBadRequest,
		// The timeline takes no query parameter (api/openapi.yaml lists the 400).
		"/ui/orders/" + uuid.NewString() + "?x=1": http.StatusBadRequest,
	} {
		body := b.page(path, status)
		if !strings.Contains(body, `<div class="error" id="error">`) || !strings.Contains(body, fmt.Sprintf("<h1>%d ", status)) {
			t.Errorf("GET %s: not an error page:\n%s", path, body)
		}
	}
	if body := b.page("/ui/?limit=5", http.StatusBadRequest); !strings.Contains(body, "Unknown query parameter &#34;limit&#34;") {
		t.Errorf("the 400 page does not name the parameter:\n%s", body)
	}
	o := b.createOrder(validOrder, nil)
	if body := b.page("/ui/orders/"+o.OrderID+"?utm_source=chat", http.StatusBadRequest); !strings.Contains(body, "Unknown query parameter &#34;utm_source&#34;") {
		t.Errorf("the timeline's 400 page does not name the parameter:\n%s", body)
	}
	// The list's filter form sends its blank fields: "any", not a 400.
	if body := b.page("/ui/?status=&customer_id=", http.StatusOK); !strings.Contains(body, o.OrderID) {
		t.Errorf("the blank filters did not list every order:\n%s", body)
	}
}

// The list: newest first, filtered by status and customer, 50 a page, and
// a next-page link that keeps the filters and leads to the rest.
func TestUIOrdersListFiltersAndPages(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()
	// 51 orders of customer c-many, and one of c-other, cancelled.
	err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		for range 51 {
			o, err := domain.NewOrder(uuid.Must(uuid.NewV7()), "c-many", "EUR", []domain.Item{{SKU: "A-1", Quantity: 1, UnitPriceCents: 100}})
			if err != nil {
				return err
			}
			if _, err := store.CreateOrder(ctx, tx, o, domain.Cause{}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	other := b.createOrder(`{"customer_id":"c-other","currency":"EUR","items":[{"sku":"B-1","quantity":1,"unit_price_cents":5}]}`, nil)
	if r := b.do(http.MethodPost, "/v1/orders/"+other.OrderID+"/cancel", nil, nil); r.status != http.StatusOK {
		t.Fatalf("cancel: %d", r.status)
	}

	first := b.page("/ui/", http.StatusOK)
	if n := len(orderRow.FindAllString(first, -1)); n != 50 {
		t.Fatalf("first page: %d orders, want 50", n)
	}
	if !strings.Contains(first, other.OrderID) {
		t.Errorf("the newest order is not on the first page")
	}

	byCustomer := b.page("/ui/?customer_id=c-many", http.StatusOK)
	if n := len(orderRow.FindAllString(byCustomer, -1)); n != 50 || strings.Contains(byCustomer, "c-other") {
		t.Fatalf("customer c-many, first page: %d orders, or another customer's", n)
	}
	if !strings.Contains(byCustomer, `value="c-many"`) {
		t.Errorf("the filter form does not keep the customer")
	}
	next := regexp.MustCompile(`<a id="next" href="([^"]+)">`).FindStringSubmatch(byCustomer)
	if next == nil {
		t.Fatal("no next-page link")
	}
	link, err := url.Parse(strings.ReplaceAll(next[1], "&amp;", "&"))
	if err != nil || link.Query().Get("customer_id") != "c-many" || link.Query().Get("after") == "" {
		t.Fatalf("next-page link %q does not keep the filter", next[1])
	}
	second := b.page(link.String(), http.StatusOK)
	if n := len(orderRow.FindAllString(second, -1)); n != 1 || strings.Contains(second, `id="next"`) {
		t.Fatalf("second page: %d orders (want 1), or a next link", n)
	}

	cancelled := b.page("/ui/?status=CANCELLED", http.StatusOK)
	if n := len(orderRow.FindAllString(cancelled, -1)); n != 1 || !strings.Contains(cancelled, other.OrderID) {
		t.Fatalf("status CANCELLED: %d orders", n)
	}
	if !strings.Contains(cancelled, `<option value="CANCELLED" selected>`) {
		t.Errorf("the filter form does not keep the status")
	}
	none := b.page("/ui/?status=FULFILLED&customer_id=c-many", http.StatusOK)
	if !strings.Contains(none, `id="no-orders"`) {
		t.Errorf("no order matches, and the page does not say so")
	}
}
