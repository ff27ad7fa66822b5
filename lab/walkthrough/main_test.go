package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/yourorg/orders/internal/testenv"
	"github.com/yourorg/orders/migrations"
)

// variablesRead runs the walkthrough up to its flag parsing (-h stops it
// there) and records every environment variable it looks up.
func variablesRead(t *testing.T) map[string]bool {
	t.Helper()
	read := map[string]bool{}
	lookup := func(name string) (string, bool) {
		read[name] = true
		return "", false
	}
	var stderr bytes.Buffer
	err := run(context.Background(), []string{"-h"}, lookup, strings.NewReader(""), &bytes.Buffer{}, &stderr)
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("run -h: %v", err)
	}
	if len(read) == 0 {
		t.Fatal("the walkthrough read no variable")
	}
	return read
}

// The compose service of the walkthrough sets only variables it reads: a
// misspelt one would leave the default (localhost, wrong in a container).
func TestComposeSetsOnlyVariablesItReads(t *testing.T) {
	t.Parallel()
	testenv.ComposeSetsOnly(t, "walkthrough", slices.Collect(maps.Keys(variablesRead(t))))
}

// docs/walkthrough.md documents every variable the walkthrough reads.
func TestDocsListEveryVariable(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../../docs/walkthrough.md")
	if err != nil {
		t.Fatal(err)
	}
	for name := range variablesRead(t) {
		if !bytes.Contains(doc, []byte("`"+name+"`")) {
			t.Errorf("docs/walkthrough.md does not document %s", name)
		}
	}
}

func TestRejectsArguments(t *testing.T) {
	t.Parallel()
	none := func(string) (string, bool) { return "", false }
	err := run(context.Background(), []string{"-yes", "now"}, none, strings.NewReader(""), &bytes.Buffer{}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "unexpected arguments") {
		t.Fatalf("want an error naming the unexpected arguments, got %v", err)
	}
}

// With nothing listening, the walkthrough says what is missing and how to
// start it, instead of failing halfway through a step.
func TestSaysHowToStartTheSystem(t *testing.T) {
	t.Parallel()
	addr := testenv.FreeAddr(t) // nothing listens there
	env := map[string]string{"API_URL": "http://" + addr}
	lookup := func(name string) (string, bool) { v, ok := env[name]; return v, ok }
	err := run(context.Background(), []string{"-yes"}, lookup, strings.NewReader(""), &bytes.Buffer{}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "make dev") || !strings.Contains(err.Error(), "API_URL") {
		t.Fatalf("want an error naming API_URL and how to start the system, got %v", err)
	}
}

// With nothing where the variables point, the walkthrough names every
// part it cannot see, each with its variable, before step 1.
func TestNamesEverythingItCannotSee(t *testing.T) {
	t.Parallel()
	closed := testenv.FreeAddr(t) // nothing listens there
	env := map[string]string{
		"API_URL": "http://" + closed, "CONSUMER_ADMIN_URL": "http://" + closed, "WEBHOOK_RECEIVER_URL": "http://" + closed,
		"DATABASE_URL": "postgres://postgres@" + closed + "/orders?sslmode=disable", "AMQP_URL": "amqp://guest:guest@" + closed + "/",
	}
	lookup := func(name string) (string, bool) { v, ok := env[name]; return v, ok }
	err := run(context.Background(), []string{"-yes"}, lookup, strings.NewReader(""), &bytes.Buffer{}, &bytes.Buffer{})
	if err == nil {
		t.Fatal("the walkthrough ran against nothing")
	}
	for _, want := range []string{"API_URL", "CONSUMER_ADMIN_URL", "WEBHOOK_RECEIVER_URL", "DATABASE_URL", "AMQP_URL", `database "orders"`, `vhost "/"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error does not name %s:\n%v", want, err)
		}
	}
}

// A database and a vhost that answer but are not the running system's
// (order-api's newest order is not in the database, the consumers' queues
// are not in the vhost): the walkthrough refuses, naming both.
func TestRefusesAnotherSystemsDatabaseAndVhost(t *testing.T) {
	t.Parallel()
	db := testenv.NewDatabase(t, migrations.Schemas...) // migrated, and empty
	amqpURL := testenv.NewVhost(t)
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/readyz":
			_, _ = w.Write([]byte(`{"status":"ready"}`))
		case "/v1/orders": // an order of another database
			_, _ = w.Write([]byte(`{"orders":[{"order_id":"01a2b3c4-0000-7000-8000-000000000001"}],"next_cursor":null}`))
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(api.Close)
	env := map[string]string{
		"API_URL": api.URL, "CONSUMER_ADMIN_URL": api.URL, "WEBHOOK_RECEIVER_URL": "",
		"DATABASE_URL": db.URLAs(migrations.RoleOperator), "AMQP_URL": amqpURL, // as make dev and compose run it
	}
	lookup := func(name string) (string, bool) { v, ok := env[name]; return v, ok }
	err := run(context.Background(), []string{"-yes"}, lookup, strings.NewReader(""), &bytes.Buffer{}, &bytes.Buffer{})
	if err == nil {
		t.Fatal("the walkthrough ran against another system's database and vhost")
	}
	for _, want := range []string{
		"order-api writes to another database", `database "` + db.Name + `"`, "DATABASE_URL",
		"no queue orders.fulfillment", "not the vhost order-consumer uses", "AMQP_URL",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error does not say %q:\n%v", want, err)
		}
	}
}

// The walkthrough sends API_TOKEN to order-api; an API that refuses it is
// named, with how to get a token, before step 1.
func TestSendsItsTokenAndSaysWhenRefused(t *testing.T) {
	t.Parallel()
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/readyz":
			_, _ = w.Write([]byte(`{"status":"ready"}`))
		case r.URL.Path == "/v1/orders" && r.Header.Get("Authorization") == "Bearer the-token":
			_, _ = w.Write([]byte(`{"orders":[],"next_cursor":null}`))
		default:
			w.WriteHeader(http.StatusUnauthorized)
		}
	}))
	t.Cleanup(api.Close)
	closed := testenv.FreeAddr(t)
	for token, refused := range map[string]bool{"": true, "another": true, "the-token": false} {
		env := map[string]string{
			"API_URL": api.URL, "CONSUMER_ADMIN_URL": api.URL, "WEBHOOK_RECEIVER_URL": "", "API_TOKEN": token,
			"DATABASE_URL": "postgres://postgres@" + closed + "/orders?sslmode=disable", "AMQP_URL": "amqp://guest:guest@" + closed + "/",
		}
		lookup := func(name string) (string, bool) { v, ok := env[name]; return v, ok }
		err := run(context.Background(), []string{"-yes"}, lookup, strings.NewReader(""), &bytes.Buffer{}, &bytes.Buffer{})
		if err == nil {
			t.Fatal("the walkthrough ran against nothing")
		}
		if got := strings.Contains(err.Error(), "answers 401: it needs an operator's token (API_TOKEN"); got != refused {
			t.Errorf("API_TOKEN=%q: refusal named %v, want %v:\n%v", token, got, refused, err)
		}
	}
}

// Under docker compose the walkthrough runs inside the network: it reaches
// the web UIs by their service names, and the links it prints must be the
// ports published on the reader's machine. It checks at the one address
// and prints the other; without the browser addresses (make dev) both are
// the same.
func TestChecksInsideTheNetworkAndLinksForTheBrowser(t *testing.T) {
	t.Parallel()
	up := func() string {
		srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
		t.Cleanup(srv.Close)
		return srv.URL
	}
	closed := "http://" + testenv.FreeAddr(t) // nothing listens there
	inside := map[string]string{"API_URL": "http://order-api:8080", "JAEGER_URL": up(), "RABBITMQ_UI_URL": up(), "GRAFANA_URL": up(),
		"PROMETHEUS_URL": up(), "CONSUMER_ADMIN_URL": "http://order-consumer:9102"}
	browser := map[string]string{"API_BROWSER_URL": "http://localhost:18080", "JAEGER_BROWSER_URL": closed + "/jaeger",
		"RABBITMQ_UI_BROWSER_URL": closed + "/rabbitmq", "GRAFANA_BROWSER_URL": closed + "/grafana", "PROMETHEUS_BROWSER_URL": closed + "/prometheus"}
	env := func(vars ...map[string]string) func(name, def string) string {
		return func(name, def string) string {
			for _, m := range vars {
				if v, ok := m[name]; ok {
					return v
				}
			}
			return def
		}
	}

	s := &system{cfg: configFrom(env(inside, browser)), http: http.DefaultClient}
	s.lookForUIs(t.Context())
	if !s.jaeger || !s.rabbitUI || !s.grafana || !s.prometheus {
		t.Fatalf("UIs answering at JAEGER_URL, RABBITMQ_UI_URL, GRAFANA_URL, PROMETHEUS_URL found: jaeger %v, RabbitMQ %v, Grafana %v, Prometheus %v (absent: %s)",
			s.jaeger, s.rabbitUI, s.grafana, s.prometheus, s.absentUIs())
	}
	hints := strings.Join([]string{s.timelineHint("o-1"), s.traceHint("t-1", "x"), s.queuesHint("x"), s.grafanaHint("p", "m"), s.metricHint("m_total")}, "\n")
	for _, want := range []string{"http://localhost:18080/ui/orders/o-1", closed + "/jaeger/trace/t-1", closed + "/rabbitmq/#/queues", closed + "/grafana",
		closed + "/prometheus/graph?g0.expr=m_total"} {
		if !strings.Contains(hints, want) {
			t.Errorf("the hints do not link %s:\n%s", want, hints)
		}
	}
	s.grafana = false // without Grafana, a panel's hint is its metric, in Prometheus
	if hint := s.grafanaHint("p", "m_total"); !strings.Contains(hint, closed+"/prometheus/graph?g0.expr=m_total") {
		t.Errorf("without Grafana, the hint %q does not link the metric in Prometheus", hint)
	}
	for _, name := range []string{"API_URL", "JAEGER_URL", "RABBITMQ_UI_URL", "GRAFANA_URL", "PROMETHEUS_URL", "CONSUMER_ADMIN_URL"} {
		if strings.Contains(hints, inside[name]) {
			t.Errorf("the hints link %s's %s, an address inside the network:\n%s", name, inside[name], hints)
		}
	}

	// The browser's addresses answering is not the walkthrough reaching
	// the UIs: it checks where it reaches them.
	swapped := map[string]string{"JAEGER_URL": closed, "RABBITMQ_UI_URL": closed, "GRAFANA_URL": closed,
		"JAEGER_BROWSER_URL": up(), "RABBITMQ_UI_BROWSER_URL": up(), "GRAFANA_BROWSER_URL": up()}
	s = &system{cfg: configFrom(env(swapped)), http: http.DefaultClient}
	s.lookForUIs(t.Context())
	if s.jaeger || s.rabbitUI || s.grafana {
		t.Errorf("UIs found at the browser's addresses, not the walkthrough's: jaeger %v, RabbitMQ %v, Grafana %v", s.jaeger, s.rabbitUI, s.grafana)
	}

	// make dev: one address for both.
	cfg := configFrom(env(inside))
	for name, got := range map[string]string{"API_URL": cfg.APIBrowserURL, "JAEGER_URL": cfg.JaegerBrowserURL,
		"RABBITMQ_UI_URL": cfg.RabbitUIBrowserURL, "GRAFANA_URL": cfg.GrafanaBrowserURL} {
		if got != inside[name] {
			t.Errorf("without a browser address, the links use %q, want %s's %q", got, name, inside[name])
		}
	}
}

// The demo compose stack's walkthrough service sets both: the services'
// names for the walkthrough, localhost for the browser
// (deploy/compose_test.go checks the ports against those compose publishes).
func TestComposeSeparatesTheWalkthroughsAddressesFromTheBrowsers(t *testing.T) {
	t.Parallel()
	p := testenv.Compose(t, testenv.ComposeFile, testenv.DemoComposeFile)
	services := testenv.ComposeServicesOf(p, "walkthrough")
	if len(services) == 0 {
		t.Fatal("no walkthrough service in the demo stack")
	}
	for _, svc := range services {
		cfg := configFrom(func(name, def string) string {
			if v := svc.Environment[name]; v != nil {
				return *v
			}
			return def
		})
		for _, pair := range []struct{ name, inside, browser string }{
			{"API", cfg.APIURL, cfg.APIBrowserURL},
			{"JAEGER", cfg.JaegerURL, cfg.JaegerBrowserURL},
			{"RABBITMQ_UI", cfg.RabbitUIURL, cfg.RabbitUIBrowserURL},
			{"GRAFANA", cfg.GrafanaURL, cfg.GrafanaBrowserURL},
		} {
			in, err := url.Parse(pair.inside)
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := p.Services[in.Hostname()]; !ok {
				t.Errorf("service %s: %s_URL %s is not a service of the compose network: the walkthrough would look in its own container", svc.Name, pair.name, pair.inside)
			}
			out, err := url.Parse(pair.browser)
			if err != nil {
				t.Fatal(err)
			}
			if h := out.Hostname(); h != "localhost" && h != "127.0.0.1" {
				t.Errorf("service %s: the links for %s go to %s, which a browser on this machine cannot reach (set %s_BROWSER_URL)", svc.Name, pair.name, pair.browser, pair.name)
			}
		}
	}
}

// A broker that refuses the walkthrough's user gets a hint that makes it
// import the user; any other failure to connect gets none. Every hint
// names a command of the demo that starts, or restarts, what differs.
func TestRefusedUserHint(t *testing.T) {
	t.Parallel()
	u, err := url.Parse(testenv.NewVhost(t))
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword("walkthrough-nobody-"+uuid.NewString(), "wrong") // a user the broker has not
	_, err = amqp.Dial(u.String())
	if hint := refusedHint(err); !strings.Contains(hint, demoUp) {
		t.Errorf("refused login %v: hint %q, want it to name %q", err, hint, demoUp)
	}
	if hint := refusedHint(errors.New("dial tcp: connection refused")); hint != "" {
		t.Errorf("connection refused: hint %q, want none", hint)
	}
	if !strings.Contains(demoUp, "up ") || strings.Contains(demoUp, "run ") {
		t.Errorf("demoUp %q does not start the demo stack", demoUp)
	}
}
