package deploy

import (
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"

	"github.com/yourorg/orders/internal/testenv"
)

// orderctl runs from the image, so that a machine without Go has the
// operator's tool and its tokens: `docker compose run --rm orderctl token
// -operator`, `docker compose run --rm orderctl status`. Its logins are
// checked with every other service's: the operators' role with its
// password file of the secrets volume, the one the postgres service gives
// deploy/postgres/initdb (TestComposeServicesConnectAsTheirRoles, which
// requires an orderctl service), and orders-operator with its own
// (TestComposeAMQPUsersMatchDefinitions).
func TestComposeRunsOrderctl(t *testing.T) {
	t.Parallel()
	checkStacks(t, orderctlProblems)
}

// `docker compose run` starts a service's dependencies first, every time:
// a one-shot one (the secrets service) runs again, seconds per call, and
// prints its "Container ... Started" lines. orderctl runs against the stack
// `up` started, whose secrets are made, so it depends on nothing.
func TestComposeOrderctlStartsNothing(t *testing.T) {
	t.Parallel()
	checkStacks(t, orderctlDependencies)
	p, err := loadComposeDoc(t, "services:\n  secrets:\n    image: a:1\n    restart: \"no\"\n"+
		"  ctl:\n    image: a:1\n    entrypoint: [/usr/local/bin/orderctl]\n    depends_on: {secrets: {condition: service_completed_successfully}}\n", nil)
	if err != nil {
		t.Fatal(err)
	}
	wantProblems(t, orderctlDependencies(p), []string{"service ctl depends on secrets"})
}

func orderctlDependencies(p *types.Project) []string {
	var problems []string
	for _, svc := range servicesWhere(p, func(svc types.ServiceConfig) bool { return entrypointBinary(svc) == "orderctl" }) {
		for _, dep := range slices.Sorted(maps.Keys(svc.DependsOn)) {
			problems = append(problems, fmt.Sprintf("service %s depends on %s: each `docker compose run` would start %s again", svc.Name, dep, dep))
		}
	}
	return problems
}

// The audit names the operator who ran orderctl: under compose, not the
// image's user (nonroot) when .env sets ORDERS_ORDERCTL_USER.
func TestComposeOrderctlNamesTheOperator(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		env  []string
		want string
	}{
		{[]string{"ORDERS_ORDERCTL_USER=alice"}, "alice"},
		{[]string{"USER=bob"}, ""}, // the shell's: host tools' settings never reach the stack (env_test.go)
		{nil, ""},                  // orderctl falls back to the OS user
	} {
		p, err := testenv.LoadCompose(t, []cli.ProjectOptionsFn{cli.WithEnv(c.env)}, testenv.ComposeFile)
		if err != nil {
			t.Fatal(err)
		}
		ctls := testenv.ComposeServicesOf(p, "orderctl")
		if len(ctls) == 0 {
			t.Fatal("no service runs orderctl")
		}
		for _, svc := range ctls {
			if got := envValue(svc, "ORDERCTL_USER"); got != c.want {
				t.Errorf("environment %q: service %s sets ORDERCTL_USER=%q, want %q", c.env, svc.Name, got, c.want)
			}
		}
	}
}

// orderctlProblems checks the services that run orderctl: at least one; not
// started by `up` (a profile) and run once; connected to the stack's own
// database and vhost (those of order-api and outbox-relay); signing tokens
// with order-api's secret.
func orderctlProblems(p *types.Project) []string {
	ctls := servicesWhere(p, func(svc types.ServiceConfig) bool { return entrypointBinary(svc) == "orderctl" })
	if len(ctls) == 0 {
		return []string{"no service runs orderctl: without Go, there is no operator's tool and no token"}
	}
	api := servers(p, "order-api")
	relays := servers(p, "outbox-relay")
	if len(api) == 0 || len(relays) == 0 {
		return []string{"no order-api or outbox-relay to compare orderctl's settings with"}
	}
	var problems []string
	for _, svc := range ctls {
		if len(svc.Profiles) == 0 {
			problems = append(problems, fmt.Sprintf("service %s has no profile: `up` would start orderctl, which prints its usage and exits", svc.Name))
		}
		if !oneShot(svc) {
			problems = append(problems, fmt.Sprintf("service %s restarts (%s): a command runs once", svc.Name, restartPolicy(svc)))
		}
		for _, c := range []struct{ variable, other string }{{"DATABASE_URL", api[0].Name}, {"AMQP_URL", relays[0].Name}} {
			want := p.Services[c.other]
			if got, other := endpoint(envValue(svc, c.variable)), endpoint(envValue(want, c.variable)); got != other {
				problems = append(problems, fmt.Sprintf("service %s: %s reaches %q, not the stack's %q (service %s)", svc.Name, c.variable, got, other, c.other))
			}
		}
		if got := jwtSecretOf(svc); got == "" || got != jwtSecretOf(api[0]) {
			problems = append(problems, fmt.Sprintf("service %s: API_JWT_SECRET is not order-api's: its tokens would be refused", svc.Name))
		}
	}
	return problems
}

// jwtSecretOf is the token secret a service is given: the file of
// API_JWT_SECRET_FILE (the stack's secrets volume), else API_JWT_SECRET.
func jwtSecretOf(svc types.ServiceConfig) string {
	if file := envValue(svc, "API_JWT_SECRET_FILE"); file != "" {
		return "the file " + file
	}
	return envValue(svc, "API_JWT_SECRET")
}

// endpoint is where a URL leads, without its user: host, port and path
// (the database, the vhost). "" for no URL; the URL itself when it does not
// parse; for a list of AMQP URLs (the nodes of a cluster), the endpoint of
// each, in order.
func endpoint(raw string) string {
	if raw == "" {
		return ""
	}
	if strings.HasPrefix(raw, "amqp") && strings.Contains(raw, ",") {
		var each []string
		for u := range strings.SplitSeq(raw, ",") {
			each = append(each, endpoint(strings.TrimSpace(u)))
		}
		return strings.Join(each, ",")
	}
	u, err := url.Parse(raw)
	if err != nil {
		return raw
	}
	return u.Host + u.Path
}

func TestOrderctlChecks(t *testing.T) {
	t.Parallel()
	const secret = "0123456789abcdef0123456789abcdef"
	stack := map[string]string{
		"api": "\n    image: orders:dev\n    entrypoint: [/usr/local/bin/order-api]\n    environment: {API_JWT_SECRET: " + secret +
			", DATABASE_URL: \"postgres://orders_api:a@db:5432/orders\"}",
		"relay": "\n    image: orders:dev\n    entrypoint: [/usr/local/bin/outbox-relay]\n    environment: {AMQP_URL: \"amqp://orders-relay:r@broker:5672/\"}",
	}
	ctl := func(env, extra string) string {
		return "\n    image: orders:dev\n    entrypoint: [/usr/local/bin/orderctl]\n    environment: {" + env + "}" + extra
	}
	const tool = "\n    profiles: [tools]\n    restart: \"no\""
	good := "DATABASE_URL: \"postgres://orders_operator:o@db:5432/orders\", AMQP_URL: \"amqp://orders-operator:o@broker:5672/\", API_JWT_SECRET: " + secret
	tests := []struct {
		name string
		ctl  string // "": no orderctl service
		want []string
	}{
		{"the stack's tool", ctl(good, tool), nil},
		{"none", "", []string{"no service runs orderctl"}},
		{"started by up", ctl(good, "\n    restart: \"no\""), []string{"service ctl has no profile"}},
		{"restarting", ctl(good, "\n    profiles: [tools]\n    restart: unless-stopped"), []string{"service ctl restarts (unless-stopped)"}},
		{"the host's database", ctl("DATABASE_URL: \"postgres://orders_operator:o@host.docker.internal:5432/orders\", AMQP_URL: \"amqp://orders-operator:o@broker:5672/\", API_JWT_SECRET: "+secret, tool),
			[]string{`DATABASE_URL reaches "host.docker.internal:5432/orders", not the stack's "db:5432/orders"`}},
		{"another vhost", ctl("DATABASE_URL: \"postgres://orders_operator:o@db:5432/orders\", AMQP_URL: \"amqp://orders-operator:o@broker:5672/other\", API_JWT_SECRET: "+secret, tool),
			[]string{`AMQP_URL reaches "broker:5672/other"`}},
		{"no AMQP_URL", ctl("DATABASE_URL: \"postgres://orders_operator:o@db:5432/orders\", API_JWT_SECRET: "+secret, tool),
			[]string{`AMQP_URL reaches ""`}},
		{"another secret file", ctl("DATABASE_URL: \"postgres://orders_operator:o@db:5432/orders\", AMQP_URL: \"amqp://orders-operator:o@broker:5672/\", API_JWT_SECRET_FILE: /run/orders-secrets/api-jwt-secret", tool),
			[]string{"API_JWT_SECRET is not order-api's"}},
		{"another secret", ctl("DATABASE_URL: \"postgres://orders_operator:o@db:5432/orders\", AMQP_URL: \"amqp://orders-operator:o@broker:5672/\", API_JWT_SECRET: x"+secret, tool),
			[]string{"API_JWT_SECRET is not order-api's"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			doc := "services:\n"
			for _, name := range []string{"api", "relay"} {
				doc += "  " + name + ":" + stack[name] + "\n"
			}
			if tt.ctl != "" {
				doc += "  ctl:" + tt.ctl + "\n"
			}
			p, err := loadComposeDoc(t, doc, nil, allProfiles...)
			if err != nil {
				t.Fatalf("load: %v\n%s", err, doc)
			}
			wantProblems(t, orderctlProblems(p), tt.want)
		})
	}
}

// The compose files' orderctl is found by TestComposeRunsOrderctl in both
// stacks; this keeps the service named as the README tells people to run
// it (docker compose run --rm orderctl ...).
func TestComposeOrderctlServiceName(t *testing.T) {
	t.Parallel()
	p := testenv.Compose(t)
	if svc, ok := p.Services["orderctl"]; !ok || entrypointBinary(svc) != "orderctl" {
		t.Errorf("%s has no service orderctl running /usr/local/bin/orderctl: `docker compose run --rm orderctl token -operator` would fail", testenv.ComposeFile)
	}
}
