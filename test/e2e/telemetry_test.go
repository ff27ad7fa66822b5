package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/yourorg/orders/internal/messaging"
	"github.com/yourorg/orders/internal/messaging/outbox"
	"github.com/yourorg/orders/internal/testenv"
)

// With OTEL_TRACES_EXPORTER=console each process prints its spans on
// stdout; one order's trace id shows up in all three.
func TestOneTraceIDAcrossTheProcesses(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	s.env = append(s.env, "OTEL_TRACES_EXPORTER=console")
	s.startAPI()
	s.startConsumer("consumer")
	s.startRelay("relay")

	code, body := s.post("/v1/orders", map[string]any{"customer_id": "c-1", "currency": "EUR",
		"items": []map[string]any{{"sku": "A-1", "quantity": 1, "unit_price_cents": 500}}})
	if code != http.StatusCreated {
		t.Fatalf("create: %d", code)
	}
	id := body["order_id"].(string)
	s.waitStatus(id, "FULFILLED")

	apiTraces := traceIDs(t, s.output("order-api"), "POST /v1/orders")
	if len(apiTraces) != 1 {
		t.Fatalf("order-api printed %d traces of POST /v1/orders", len(apiTraces))
	}
	var traceID string
	for id := range apiTraces {
		traceID = id
	}
	// The last span of the flow ends a moment after the order is FULFILLED.
	testenv.WaitFor(t, 10*time.Second, "the notification of order.fulfilled in the trace", func() bool {
		return strings.Count(s.output("consumer"), traceID) >= 5
	})
	for _, p := range []string{"relay", "consumer"} {
		if !strings.Contains(s.output(p), `"TraceID":"`+traceID+`"`) {
			t.Errorf("%s printed no span of trace %s", p, traceID)
		}
	}
	if !strings.Contains(s.output("relay"), `"Name":"publish orders.events"`) || !strings.Contains(s.output("consumer"), `"Name":"process orders.fulfillment`) {
		t.Error("the publish and process spans are missing from the console output")
	}
	t.Logf("trace %s: %d spans in order-api's output, %d in the relay's, %d in the consumer's", traceID,
		strings.Count(s.output("order-api"), traceID), strings.Count(s.output("relay"), traceID), strings.Count(s.output("consumer"), traceID))
}

// traceIDs returns the trace ids of the console spans named name.
func traceIDs(t *testing.T, output, name string) map[string]bool {
	t.Helper()
	ids := map[string]bool{}
	sc := bufio.NewScanner(strings.NewReader(output))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var span struct {
			Name        string
			SpanContext struct{ TraceID string }
		}
		if json.Unmarshal(sc.Bytes(), &span) == nil && span.Name == name {
			ids[span.SpanContext.TraceID] = true
		}
	}
	return ids
}

// Every metric docs/observability.md documents is on the /metrics of its
// process, and the duplicate counter moves when a duplicate is delivered.
func TestMetricsAreDocumentedAndMove(t *testing.T) {
	t.Parallel()
	webhook := failOnceWebhook(t)
	s := newSystem(t)
	s.env = append(s.env, "NOTIFY_WEBHOOK_URL="+webhook.URL, "RELAY_MAX_ATTEMPTS=2")
	s.startAPI()
	consumerAdmin := s.startConsumer("consumer")
	relayAdmin := s.startRelay("relay")

	// Traffic: orders (one out of stock, one cancelled), a replay of the
	// idempotency key, a poison message, an unroutable row and a row whose
	// relay vanished.
	for i, sku := range []string{"A-1", "OOS-1", "A-2"} {
		code, body := s.postWithKey("/v1/orders", "key-"+sku, map[string]any{"customer_id": "c", "currency": "EUR",
			"items": []map[string]any{{"sku": sku, "quantity": 1, "unit_price_cents": 500}}})
		if code != http.StatusCreated {
			t.Fatalf("create: %d", code)
		}
		if i == 2 {
			s.post("/v1/orders/"+body["order_id"].(string)+"/cancel", nil)
		}
	}
	s.postWithKey("/v1/orders", "key-A-1", map[string]any{"customer_id": "c", "currency": "EUR",
		"items": []map[string]any{{"sku": "A-1", "quantity": 1, "unit_price_cents": 500}}})
	s.publishRaw(amqp.Publishing{MessageId: uuid.NewString(), Type: "order.submitted", ContentType: "application/json",
		Headers: amqp.Table{messaging.HeaderMessageVersion: int32(1)}, Body: []byte("{not json")})
	db, err := pgx.Connect(context.Background(), s.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(context.Background())
	_, err = db.Exec(context.Background(), `INSERT INTO message_outbox (outbox_id, aggregate_type, aggregate_id, message_type, message_version,
		exchange_name, routing_key, payload, headers) VALUES (gen_random_uuid(), 'order', 'x', 'audit.nobody', 1, 'orders.events', 'audit.nobody', '{}', '{}'),
		(gen_random_uuid(), 'order', 'y', 'order.cancelled', 1, 'orders.events', 'order.cancelled', '{"order_id":"`+uuid.NewString()+`"}', '{}')`)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(context.Background(), `UPDATE message_outbox SET status = 'PUBLISHING', claimed_by = 'ghost', claimed_until = now() - interval '1 second'
		WHERE aggregate_id = 'y'`); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "the unroutable row to fail", func() bool {
		var n int
		_ = db.QueryRow(context.Background(), "SELECT count(*) FROM message_outbox WHERE status = 'FAILED'").Scan(&n)
		return n == 1
	})

	// A duplicate: the first order.submitted again, as a relay would republish it.
	before := sumMetric(scrape(t, consumerAdmin), "consumer_messages_duplicates_total")
	var row outbox.Row
	var headers map[string]string
	err = db.QueryRow(context.Background(), `SELECT outbox_id, message_type, message_version, exchange_name, routing_key, payload, headers, created_at
		FROM message_outbox WHERE message_type = 'order.submitted' ORDER BY created_at LIMIT 1`).
		Scan(&row.ID, &row.Type, &row.Version, &row.Exchange, &row.RoutingKey, &row.Payload, &headers, &row.CreatedAt)
	if err != nil {
		t.Fatal(err)
	}
	row.Headers = headers
	s.publishRaw(outbox.Publishing(row))
	testenv.WaitFor(t, 15*time.Second, "the duplicate counter to move", func() bool {
		// order.submitted goes to fulfillment and notification: two duplicates.
		return sumMetric(scrape(t, consumerAdmin), "consumer_messages_duplicates_total") >= before+2
	})
	testenv.WaitFor(t, 15*time.Second, "a webhook retry", func() bool {
		return strings.Contains(scrape(t, consumerAdmin), `reason_code="webhook_unavailable"`)
	})

	scrapes := map[string]string{
		"order-api":      scrapeWith(t, s.client, s.apiURL),
		"outbox-relay":   scrape(t, relayAdmin),
		"order-consumer": scrape(t, consumerAdmin),
	}
	documented := documentedMetrics(t)
	for section, names := range documented {
		for _, name := range names {
			if strings.HasPrefix(name, "relay_wal_") {
				continue // RELAY_MODE=wal only; cmd/outbox-relay's TestRelayProcessInWALMode finds them on /metrics
			}
			if name == "db_table_vacuum_age_seconds" {
				continue // absent until the table's first vacuum; tablestats' TestDeadTuplesRiseAndVacuumClearsThem sees it
			}
			found := false
			for process, text := range scrapes {
				if (section == process || section == "database") && hasMetric(text, name) {
					found = true
				}
			}
			if !found {
				t.Errorf("%s (documented under %q) is on no /metrics", name, section)
			}
		}
	}
	if len(documented["order-api"]) == 0 || len(documented["outbox-relay"]) == 0 || len(documented["order-consumer"]) == 0 || len(documented["database"]) == 0 {
		t.Fatalf("docs/observability.md sections not found: %v", documented)
	}
}

// documentedMetrics reads the metric tables of docs/observability.md: the
// names in the first column, by section.
func documentedMetrics(t *testing.T) map[string][]string {
	t.Helper()
	doc, err := os.ReadFile("../../docs/observability.md")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	section := ""
	name := regexp.MustCompile("`([a-z_]+)`")
	for _, line := range strings.Split(string(doc), "\n") {
		switch {
		case strings.HasPrefix(line, "### "):
			section = strings.TrimPrefix(line, "### ")
			if strings.Contains(section, "database") {
				section = "database"
			}
		case strings.HasPrefix(line, "## "):
			section = ""
		case section != "" && strings.HasPrefix(line, "| `"):
			first := strings.Split(line, "|")[1]
			for _, m := range name.FindAllStringSubmatch(first, -1) {
				out[section] = append(out[section], m[1])
			}
		}
	}
	return out
}

func hasMetric(text, name string) bool {
	for _, suffix := range []string{"", "_bucket"} {
		if strings.Contains(text, "\n"+name+suffix+"{") || strings.Contains(text, "\n"+name+suffix+" ") {
			return true
		}
	}
	return false
}

func scrape(t *testing.T, base string) string {
	t.Helper()
	return scrapeWith(t, http.DefaultClient, base)
}

// scrapeWith reads base's /metrics with client.
func scrapeWith(t *testing.T, client *http.Client, base string) string {
	t.Helper()
	resp, err := client.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return "\n" + string(b)
}

// sumMetric adds up every series of a counter.
func sumMetric(text, name string) float64 {
	var sum float64
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, name+"{") || strings.HasPrefix(line, name+" ") {
			fields := strings.Fields(line)
			if v, err := strconv.ParseFloat(fields[len(fields)-1], 64); err == nil {
				sum += v
			}
		}
	}
	return sum
}

// failOnceWebhook answers 503 to the first call of each Idempotency-Key.
func failOnceWebhook(t *testing.T) *httptest.Server {
	var mu sync.Mutex
	seen := map[string]bool{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		key := r.Header.Get("Idempotency-Key")
		if !seen[key] {
			seen[key] = true
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(srv.Close)
	return srv
}
