package httpapi_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/yourorg/orders/internal/auth"
	"github.com/yourorg/orders/internal/config"
	"github.com/yourorg/orders/internal/httpapi"
	"github.com/yourorg/orders/internal/telemetry"
)

// The labels of the HTTP server metrics come from the route template, the
// method and the status: a client that sends many Host headers, ports and
// unknown paths adds no series to /metrics.
func TestHTTPMetricsLabelsComeFromTheRoute(t *testing.T) {
	t.Parallel()
	tel, err := telemetry.Setup(t.Context(), "order-api",
		config.Telemetry{TracesExporter: "none", LogsExporter: "none", OTLPProtocol: "http/protobuf"},
		config.Log{Level: "info", Format: "json"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tel.Shutdown(t.Context()) })
	b := setupWith(t, func(_ *httpapi.Config, d *httpapi.Deps) {
		d.MeterProvider, d.MetricsHandler = tel.MeterProvider, tel.MetricsHandler
	})
	order := b.createOrder(validOrder, nil)
	operator := b.token("operator-1", auth.RoleOperator)

	// send makes one request with the given Host header; the server's
	// answer does not matter, only what /metrics makes of it.
	send := func(method, path, host string) {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), method, b.server.URL+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Host = host
		req.Header.Set("Authorization", "Bearer "+operator)
		resp, err := b.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	round := func(i int, host string) {
		send(http.MethodGet, "/healthz", host)
		send(http.MethodGet, "/v1/orders/"+order.OrderID, host)
		send(http.MethodGet, "/v1/orders/"+uuid.NewString(), host)                // 404 of a known route
		send(http.MethodGet, fmt.Sprintf("/no/such/path-%d", i), host)            // 404 of no route
		send(http.MethodGet, fmt.Sprintf("/v1/orders/%d/nothing/%d", i, i), host) // 404 under a route
		send(http.MethodPost, fmt.Sprintf("/healthz-%d", i), host)
	}
	round(0, "localhost")
	httpSeries(t, b) // the scrape has a series of its own
	before := httpSeries(t, b)
	if len(before) == 0 {
		t.Fatal("no http_server_request_duration_seconds series after the first round")
	}
	for i := 1; i <= 50; i++ {
		round(i, fmt.Sprintf("client-%d.example:%d", i, 1000+i))
	}
	after := httpSeries(t, b)
	for _, s := range after {
		if strings.Contains(s, "client-") || strings.Contains(s, "path-") || strings.Contains(s, "nothing") ||
			strings.Contains(s, "healthz-") || strings.Contains(s, order.OrderID) {
			t.Errorf("a series carries what the client sent: %s", s)
		}
	}
	if len(after) != len(before) {
		t.Errorf("50 rounds with other Host headers and paths took the series from %d to %d:\nbefore:\n%s\nafter:\n%s",
			len(before), len(after), strings.Join(before, "\n"), strings.Join(after, "\n"))
	}
}

// httpSeries scrapes /metrics and returns the series of the request
// duration histogram (its _count lines, without their values).
func httpSeries(t *testing.T, b *testBundle) []string {
	t.Helper()
	r := b.do(http.MethodGet, "/metrics", nil, nil)
	if r.status != http.StatusOK {
		t.Fatalf("GET /metrics: %d", r.status)
	}
	var series []string
	sc := bufio.NewScanner(bytes.NewReader(r.body))
	sc.Buffer(make([]byte, 0, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "http_server_request_duration_seconds_count{") {
			series = append(series, line[:strings.LastIndexByte(line, ' ')])
		}
	}
	return series
}
