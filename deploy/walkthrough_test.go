package deploy

import (
	"cmp"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"

	"github.com/yourorg/orders/internal/testenv"
)

// The demo's walkthrough runs inside the compose network: it must reach
// order-api and the web UIs by their service names (localhost is its own
// container), and the links it prints must lead the reader's browser to
// the ports those services publish on this machine, wherever .env moves
// them.
func TestComposeWalkthroughLinksReachTheBrowser(t *testing.T) {
	t.Parallel()
	files := []string{testenv.ComposeFile, testenv.DemoComposeFile}
	reportProblems(t, walkthroughLinkProblems(testenv.Compose(t, files...)))
	moved, err := testenv.LoadCompose(t, []cli.ProjectOptionsFn{newPortLookup().option()}, files...)
	if err != nil {
		t.Fatal(err)
	}
	for _, problem := range walkthroughLinkProblems(moved) {
		t.Errorf("with the ORDERS_*_PORT variables set: %s", problem)
	}
}

// walkthroughLink is a part of the system the walkthrough reaches at one
// variable and links for the browser with another.
type walkthroughLink struct {
	what, reach, browse string
	is                  func(types.ServiceConfig) bool
}

var walkthroughLinks = []walkthroughLink{
	{"order-api", "API_URL", "API_BROWSER_URL", func(svc types.ServiceConfig) bool {
		return entrypointBinary(svc) == "order-api" && !isMigrationStep(svc)
	}},
	{"Jaeger", "JAEGER_URL", "JAEGER_BROWSER_URL", imageNamed("jaeger")},
	{"the RabbitMQ management UI", "RABBITMQ_UI_URL", "RABBITMQ_UI_BROWSER_URL", imageNamed("rabbitmq")},
	{"Grafana", "GRAFANA_URL", "GRAFANA_BROWSER_URL", imageNamed("grafana")},
	{"Prometheus", "PROMETHEUS_URL", "PROMETHEUS_BROWSER_URL", imageNamed("prometheus")},
}

// imageNamed matches a service whose image's repository contains name
// (jaegertracing/all-in-one, grafana/grafana).
func imageNamed(name string) func(types.ServiceConfig) bool {
	return func(svc types.ServiceConfig) bool {
		repo, _, _ := imageParts(svc.Image)
		return strings.Contains(repo, name)
	}
}

// walkthroughLinkProblems checks each walkthrough service's addresses: the
// one it reaches names a service of the network that runs that part; the
// one it prints (the same when unset, as in the walkthrough) is
// localhost, or the address the port is published on, at the host port
// that service publishes for the port the walkthrough reaches.
func walkthroughLinkProblems(p *types.Project) []string {
	var problems []string
	for _, w := range servicesWhere(p, func(svc types.ServiceConfig) bool { return entrypointBinary(svc) == "walkthrough" }) {
		for _, l := range walkthroughLinks {
			reach := envValue(w, l.reach)
			in, err := url.Parse(reach)
			if err != nil || in.Hostname() == "" {
				problems = append(problems, fmt.Sprintf("service %s: %s %q names no host", w.Name, l.reach, reach))
				continue
			}
			target, ok := p.Services[in.Hostname()]
			if !ok || !l.is(target) {
				problems = append(problems, fmt.Sprintf("service %s: %s %s is not a service of the compose network running %s (the walkthrough runs inside it)", w.Name, l.reach, reach, l.what))
				continue
			}
			port := cmp.Or(in.Port(), map[string]string{"http": "80", "https": "443"}[in.Scheme])
			i := slices.IndexFunc(target.Ports, func(pc types.ServicePortConfig) bool {
				return strconv.Itoa(int(pc.Target)) == port && pc.Published != ""
			})
			if i < 0 {
				problems = append(problems, fmt.Sprintf("service %s: %s publishes no host port for %s: the walkthrough's links to it lead nowhere", w.Name, target.Name, port))
				continue
			}
			published := target.Ports[i]
			browse := cmp.Or(envValue(w, l.browse), reach)
			out, err := url.Parse(browse)
			hosts := []string{"localhost", "127.0.0.1"}
			if !anyAddress(published.HostIP) {
				hosts = append(hosts, published.HostIP)
			}
			if err != nil || !slices.Contains(hosts, out.Hostname()) || out.Port() != published.Published {
				problems = append(problems, fmt.Sprintf("service %s: the links to %s go to %s, not where %s publishes port %s on this machine (localhost:%s): set %s",
					w.Name, l.what, browse, target.Name, port, published.Published, l.browse))
			}
		}
	}
	return problems
}

func TestWalkthroughLinkChecks(t *testing.T) {
	t.Parallel()
	services := map[string]string{
		"api":        "\n    image: orders:dev\n    entrypoint: [/usr/local/bin/order-api]\n    ports: [\"127.0.0.1:18080:8080\"]",
		"traces":     "\n    image: jaegertracing/all-in-one:1.62.0\n    ports: [\"127.0.0.1:16686:16686\"]",
		"broker":     "\n    image: rabbitmq:3.13.7-management-alpine\n    ports: [\"127.0.0.1:15672:15672\"]",
		"dashboards": "\n    image: grafana/grafana:11.3.1\n    ports: [\"3001:3000\"]",
		"metrics":    "\n    image: prom/prometheus:v2.55.1\n    ports: [\"127.0.0.1:9090:9090\"]",
	}
	good := map[string]string{
		"API_URL": "http://api:8080", "API_BROWSER_URL": "http://localhost:18080",
		"JAEGER_URL": "http://traces:16686", "JAEGER_BROWSER_URL": "http://localhost:16686",
		"RABBITMQ_UI_URL": "http://broker:15672", "RABBITMQ_UI_BROWSER_URL": "http://127.0.0.1:15672",
		"GRAFANA_URL": "http://dashboards:3000", "GRAFANA_BROWSER_URL": "http://localhost:3001",
		"PROMETHEUS_URL": "http://metrics:9090", "PROMETHEUS_BROWSER_URL": "http://localhost:9090",
	}
	tests := []struct {
		name    string
		env     map[string]string // changes to good; "" removes
		service map[string]string // changes to services
		want    []string
	}{
		{name: "inside and outside", env: nil},
		{name: "UIs checked on localhost", env: map[string]string{"JAEGER_URL": "http://localhost:16686", "GRAFANA_URL": "http://localhost:3001"},
			want: []string{"JAEGER_URL http://localhost:16686 is not a service of the compose network running Jaeger", "GRAFANA_URL http://localhost:3001 is not a service"}},
		{name: "links to the internal host", env: map[string]string{"API_BROWSER_URL": ""},
			want: []string{"the links to order-api go to http://api:8080, not where api publishes port 8080 on this machine (localhost:18080): set API_BROWSER_URL"}},
		{name: "the container port in the link", env: map[string]string{"GRAFANA_BROWSER_URL": "http://localhost:3000"},
			want: []string{"the links to Grafana go to http://localhost:3000"}},
		{name: "another service", env: map[string]string{"RABBITMQ_UI_URL": "http://traces:15672"},
			want: []string{"RABBITMQ_UI_URL http://traces:15672 is not a service of the compose network running the RabbitMQ management UI"}},
		{name: "not published", service: map[string]string{"traces": "\n    image: jaegertracing/all-in-one:1.62.0"},
			want: []string{"traces publishes no host port for 16686"}},
		{name: "published on another address", service: map[string]string{"api": "\n    image: orders:dev\n    entrypoint: [/usr/local/bin/order-api]\n    ports: [\"10.0.0.5:18080:8080\"]"},
			env: map[string]string{"API_BROWSER_URL": "http://10.0.0.5:18080"}},
		{name: "no address", env: map[string]string{"GRAFANA_URL": ""}, want: []string{`GRAFANA_URL "" names no host`}},
		{name: "metrics linked inside the network", env: map[string]string{"PROMETHEUS_BROWSER_URL": ""},
			want: []string{"the links to Prometheus go to http://metrics:9090"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			env := maps.Clone(good)
			for k, v := range tt.env {
				if v == "" {
					delete(env, k)
				} else {
					env[k] = v
				}
			}
			svcs := maps.Clone(services)
			maps.Copy(svcs, tt.service)
			var b strings.Builder
			b.WriteString("services:\n  tour:\n    image: orders:dev\n    entrypoint: [/usr/local/bin/walkthrough]\n    environment:\n")
			for _, k := range slices.Sorted(maps.Keys(env)) {
				fmt.Fprintf(&b, "      %s: %q\n", k, env[k])
			}
			for _, name := range slices.Sorted(maps.Keys(svcs)) {
				fmt.Fprintf(&b, "  %s:%s\n", name, svcs[name])
			}
			p, err := loadComposeDoc(t, b.String(), nil)
			if err != nil {
				t.Fatalf("load: %v\n%s", err, b.String())
			}
			wantProblems(t, walkthroughLinkProblems(p), tt.want)
		})
	}
}
