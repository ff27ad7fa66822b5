package deploy

import (
	"fmt"
	"maps"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/loader"
	"github.com/compose-spec/compose-go/v2/types"

	"github.com/yourorg/orders/internal/testenv"
)

// .env is read by two readers (.env.example says which reads what):
// docker compose fills in the ${...} of the compose files from it, and
// the host tools (make ctl, make run, scripts/env.sh) take their
// DATABASE_URL, AMQP_URL and the rest from it. So that a setting meant for
// one never steers the other, the compose files read only variables named
// ORDERS_* (which no binary reads), and never hand .env itself to a
// container.

// composePrefix begins the name of every variable the compose files read.
const composePrefix = "ORDERS_"

func TestComposeReadsOnlyItsOwnVariables(t *testing.T) {
	t.Parallel()
	example := readRepoFile(t, ".env.example")
	for _, files := range stacks {
		lookup := &recordingLookup{}
		p, err := testenv.LoadCompose(t, []cli.ProjectOptionsFn{lookup.option()}, files...)
		if err != nil {
			t.Fatal(err)
		}
		names := lookup.names()
		if len(names) == 0 {
			t.Fatalf("%s: no variable read: is the lookup in use?", strings.Join(files, " + "))
		}
		for _, problem := range slices.Concat(foreignVariables(names), undocumentedVariables(names, example), dotenvFiles(p)) {
			t.Errorf("%s: %s", strings.Join(files, " + "), problem)
		}
	}
}

// foreignVariables lists the variables the compose files read whose names
// are not compose's own.
func foreignVariables(names []string) []string {
	var problems []string
	for _, name := range names {
		if !strings.HasPrefix(name, composePrefix) {
			problems = append(problems, fmt.Sprintf("reads ${%s}: name it %s... so that the host tools' settings in .env (DATABASE_URL, AMQP_URL, ...) never reach the stack, and the stack's never the host tools", name, composePrefix))
		}
	}
	return problems
}

// undocumentedVariables lists the variables the compose files read that
// .env.example (example, its text) does not set.
func undocumentedVariables(names []string, example string) []string {
	var problems []string
	for _, name := range names {
		if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + `=`).MatchString(example) {
			problems = append(problems, fmt.Sprintf("reads ${%s}, which .env.example does not set", name))
		}
	}
	return problems
}

// dotenvFiles lists the services that read a .env file into their
// environment: every host setting would reach the container.
func dotenvFiles(p *types.Project) []string {
	var problems []string
	for _, name := range serviceNames(p) {
		for _, f := range p.Services[name].EnvFiles {
			if base := filepath.Base(f.Path); base == ".env" || strings.HasPrefix(base, ".env.") {
				problems = append(problems, fmt.Sprintf("service %s reads %s into its environment: the host tools' settings would reach it", name, f.Path))
			}
		}
	}
	return problems
}

// recordingLookup is an interpolation lookup that leaves every variable
// unset (so its default applies) and records its name.
type recordingLookup struct {
	mu   sync.Mutex
	seen map[string]bool
}

func (l *recordingLookup) lookup(name string) (string, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.seen == nil {
		l.seen = map[string]bool{}
	}
	l.seen[name] = true
	return "", false
}

func (l *recordingLookup) names() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Sorted(maps.Keys(l.seen))
}

func (l *recordingLookup) option() cli.ProjectOptionsFn {
	return cli.WithLoadOptions(func(o *loader.Options) {
		if o.Interpolate != nil {
			o.Interpolate.LookupValue = l.lookup
		}
	})
}

func TestComposeVariableChecks(t *testing.T) {
	t.Parallel()
	const example = "# ORDERS_COMMENTED=1\nORDERS_API_PORT=8080\nDATABASE_URL=postgres://x\n"
	tests := []struct {
		name, doc string
		want      []string
	}{
		{"its own, documented", "services:\n  a:\n    image: a:1\n    ports: [\"${ORDERS_API_PORT:-8080}:8080\"]\n", nil},
		{"a host tool's variable", "services:\n  a:\n    image: a:1\n    environment: {DATABASE_URL: \"${DATABASE_URL:-postgres://db/orders}\"}\n",
			[]string{"reads ${DATABASE_URL}: name it ORDERS_..."}},
		{"undocumented", "services:\n  a:\n    image: a:1\n    environment: {X: \"${ORDERS_NEW:-1}\"}\n", []string{"reads ${ORDERS_NEW}, which .env.example does not set"}},
		{"commented out is not set", "services:\n  a:\n    image: a:1\n    environment: {X: \"${ORDERS_COMMENTED:-1}\"}\n", []string{"reads ${ORDERS_COMMENTED}, which .env.example does not set"}},
		{".env into a container", "services:\n  a:\n    image: a:1\n    env_file: [.env]\n", []string{"service a reads"}},
		{"another env file", "services:\n  a:\n    image: a:1\n    env_file: [app.env]\n", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			lookup := &recordingLookup{}
			p, err := loadComposeDoc(t, tt.doc, map[string]string{".env": "", "app.env": ""}, lookup.option())
			if err != nil {
				t.Fatal(err)
			}
			names := lookup.names()
			wantProblems(t, slices.Concat(foreignVariables(names), undocumentedVariables(names, example), dotenvFiles(p)), tt.want)
		})
	}
}

// exporterVariables are the OpenTelemetry exporter settings a reader of
// .env must be able to change for the whole stack: without Jaeger, an
// exporter left on logs an export error every few seconds in every process.
var exporterVariables = []string{"OTEL_TRACES_EXPORTER", "OTEL_LOGS_EXPORTER"}

// The exporters are settable from .env (ORDERS_OTEL_TRACES_EXPORTER=none),
// and by default the services export their traces to Jaeger as before.
func TestComposeExportersAreSettable(t *testing.T) {
	t.Parallel()
	for _, files := range stacks {
		fixed := testenv.Compose(t, files...)
		moved, err := testenv.LoadCompose(t, []cli.ProjectOptionsFn{sentinelOption()}, files...)
		if err != nil {
			t.Fatal(err)
		}
		for _, problem := range fixedExporters(fixed, moved) {
			t.Errorf("%s: %s", strings.Join(files, " + "), problem)
		}
		for _, binary := range schemaBinaries {
			for _, svc := range servers(fixed, binary) {
				if got := envValue(svc, "OTEL_TRACES_EXPORTER"); got != "otlp" {
					t.Errorf("%s: service %s: OTEL_TRACES_EXPORTER is %q by default, want otlp (to Jaeger)", strings.Join(files, " + "), svc.Name, got)
				}
			}
		}
	}
}

// sentinel is the value sentinelOption gives a variable.
func sentinel(name string) string { return "from-" + name }

// sentinelOption makes the loader interpolate ORDERS_<v> as
// sentinel(ORDERS_<v>) for each v of exporterVariables, and leave every
// other variable unset.
func sentinelOption() cli.ProjectOptionsFn {
	return cli.WithLoadOptions(func(o *loader.Options) {
		if o.Interpolate != nil {
			o.Interpolate.LookupValue = func(name string) (string, bool) {
				if v, ok := strings.CutPrefix(name, composePrefix); ok && slices.Contains(exporterVariables, v) {
					return sentinel(name), true
				}
				return "", false
			}
		}
	})
}

// fixedExporters compares the project loaded with no variable set (fixed)
// and with sentinelOption (moved): each service that sets an exporter
// variable must take it from ORDERS_<variable>.
func fixedExporters(fixed, moved *types.Project) []string {
	var problems []string
	for _, name := range serviceNames(fixed) {
		for _, v := range exporterVariables {
			if fixed.Services[name].Environment[v] == nil {
				continue
			}
			if got := envValue(moved.Services[name], v); got != sentinel(composePrefix+v) {
				problems = append(problems, fmt.Sprintf("service %s sets %s to %q whatever .env says: take it from ${%s%s:-...} (and document that in .env.example)",
					name, v, envValue(fixed.Services[name], v), composePrefix, v))
			}
		}
	}
	return problems
}

func TestFixedExporters(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, env string
		want      []string
	}{
		{"settable", "{OTEL_TRACES_EXPORTER: \"${ORDERS_OTEL_TRACES_EXPORTER:-otlp}\"}", nil},
		{"not set", "{OTEL_EXPORTER_OTLP_ENDPOINT: \"http://jaeger:4318\"}", nil},
		{"fixed", "{OTEL_TRACES_EXPORTER: otlp}", []string{"service a sets OTEL_TRACES_EXPORTER to \"otlp\" whatever .env says"}},
		{"another variable", "{OTEL_LOGS_EXPORTER: \"${LOGS:-otlp}\"}", []string{"service a sets OTEL_LOGS_EXPORTER"}},
		{"one of two", "{OTEL_TRACES_EXPORTER: \"${ORDERS_OTEL_TRACES_EXPORTER:-otlp}\", OTEL_LOGS_EXPORTER: \"${ORDERS_OTEL_TRACES_EXPORTER:-otlp}\"}",
			[]string{"service a sets OTEL_LOGS_EXPORTER"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			doc := "services:\n  a:\n    image: a:1\n    environment: " + tt.env + "\n"
			fixed, err := loadComposeDoc(t, doc, nil)
			if err != nil {
				t.Fatal(err)
			}
			moved, err := loadComposeDoc(t, doc, nil, sentinelOption())
			if err != nil {
				t.Fatal(err)
			}
			wantProblems(t, fixedExporters(fixed, moved), tt.want)
		})
	}
}

// README's cancel example works only while fulfillment waits: the
// consumers' FULFILLMENT_DELAY is set from .env, and README says how
// before the example.
func TestREADMECancelsWhileFulfillmentWaits(t *testing.T) {
	t.Parallel()
	const variable = "ORDERS_FULFILLMENT_DELAY"
	p, err := testenv.LoadCompose(t, []cli.ProjectOptionsFn{cli.WithEnv([]string{variable + "=30s"})}, testenv.ComposeFile)
	if err != nil {
		t.Fatal(err)
	}
	consumers := testenv.ComposeServicesOf(p, "order-consumer")
	if len(consumers) == 0 {
		t.Fatal("no service runs order-consumer")
	}
	for _, svc := range consumers {
		if got := envValue(svc, "FULFILLMENT_DELAY"); got != "30s" {
			t.Errorf("service %s: with %s=30s, FULFILLMENT_DELAY is %q, want 30s", svc.Name, variable, got)
		}
	}
	readme := readRepoFile(t, "README.md")
	set, cancel := strings.Index(readme, variable+"="), strings.Index(readme, "/cancel")
	if set < 0 || cancel < 0 || set > cancel {
		t.Errorf("README.md does not set %s before its cancel example (at %d, the example at %d): the order is FULFILLED before anyone can cancel it", variable, set, cancel)
	}
}
