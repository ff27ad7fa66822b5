package deploy

import (
	"cmp"
	"fmt"
	"testing"
	"time"

	"github.com/compose-spec/compose-go/v2/types"
)

// Docker gives a container stop_grace_period (10 s unless set) between
// SIGTERM and SIGKILL. The binaries take up to SHUTDOWN_DELAY (order-api
// only) plus SHUTDOWN_TIMEOUT to stop gracefully: the API answers what it
// has accepted, the relay waits for its confirms, the consumer finishes the
// deliveries in hand. A shorter grace kills them in the middle of it, and a
// client's request is cut after all.

// shutdownDefaults are the binaries' defaults (README's configuration
// table), for a service that does not set them.
var shutdownDefaults = map[string]struct{ delay, timeout string }{
	"order-api":      {delay: "0s", timeout: "15s"},
	"outbox-relay":   {timeout: "15s"},
	"order-consumer": {timeout: "15s"},
}

// shutdownMargin is the process's own exit after that: the telemetry's
// last export, the pool and the broker connection closed.
const shutdownMargin = 3 * time.Second

func TestComposeGivesShutdownItsTime(t *testing.T) {
	t.Parallel()
	checkStacks(t, shutdownTimeProblems)
}

// shutdownTimeProblems lists the services of a binary whose container is
// killed before the binary's graceful shutdown can end.
func shutdownTimeProblems(p *types.Project) []string {
	var problems []string
	for _, name := range serviceNames(p) {
		svc := p.Services[name]
		binary := entrypointBinary(svc)
		defaults, ok := shutdownDefaults[binary]
		if !ok || isMigrationStep(svc) {
			continue
		}
		var need time.Duration
		for _, v := range []struct{ name, value string }{
			{"SHUTDOWN_DELAY", cmp.Or(envValue(svc, "SHUTDOWN_DELAY"), defaults.delay)},
			{"SHUTDOWN_TIMEOUT", cmp.Or(envValue(svc, "SHUTDOWN_TIMEOUT"), defaults.timeout)},
		} {
			if v.value == "" {
				continue // the binary has no such setting
			}
			d, err := time.ParseDuration(v.value)
			if err != nil {
				problems = append(problems, fmt.Sprintf("service %s: %s %q: %v", name, v.name, v.value, err))
				continue
			}
			need += d
		}
		grace := 10 * time.Second // Docker's default
		if svc.StopGracePeriod != nil {
			grace = time.Duration(*svc.StopGracePeriod)
		}
		if grace < need+shutdownMargin {
			problems = append(problems, fmt.Sprintf("service %s (%s) is killed %s after SIGTERM (stop_grace_period), but takes up to %s to stop "+
				"(SHUTDOWN_DELAY + SHUTDOWN_TIMEOUT) and %s to exit: set stop_grace_period to %s at least", name, binary, grace, need, shutdownMargin, need+shutdownMargin))
		}
	}
	return problems
}

func TestShutdownTimeChecks(t *testing.T) {
	t.Parallel()
	api := func(more string) string {
		return "services:\n  api:\n    image: o:1\n    entrypoint: [/usr/local/bin/order-api]\n" + more
	}
	tests := []struct {
		name, doc string
		want      []string
	}{
		{"docker's default grace", api(""), []string{"service api (order-api) is killed 10s after SIGTERM"}},
		{"a grace for the defaults", api("    stop_grace_period: 18s\n"), nil},
		{"a delay on top", api("    stop_grace_period: 18s\n    environment: {SHUTDOWN_DELAY: 5s}\n"), []string{"takes up to 20s to stop"}},
		{"a shorter timeout", api("    environment: {SHUTDOWN_TIMEOUT: 5s}\n"), nil},
		{"a relay", "services:\n  r:\n    image: o:1\n    entrypoint: [/usr/local/bin/outbox-relay]\n    stop_grace_period: 15s\n", []string{"service r (outbox-relay) is killed 15s after SIGTERM"}},
		{"the migration step", "services:\n  m:\n    image: o:1\n    entrypoint: [/usr/local/bin/order-api]\n    command: [migrate, up]\n", nil},
		{"another program", "services:\n  w:\n    image: o:1\n    entrypoint: [/usr/local/bin/webhook-receiver]\n", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p, err := loadComposeDoc(t, tt.doc, nil)
			if err != nil {
				t.Fatal(err)
			}
			wantProblems(t, shutdownTimeProblems(p), tt.want)
		})
	}
}
