package deploy

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/compose-spec/compose-go/v2/types"
)

// The demo recreates a broker the stack started (its definitions label,
// TestComposeBrokerRestartsWithNewDefinitions). A relay or consumer left
// running then reconnects with a backoff of up to 30 s, and the
// walkthrough's `run`, which waits for them to be healthy, failed on a
// relay gone unhealthy meanwhile. So the broker's clients carry its label,
// and compose recreates them after it, on a healthy broker; and their
// health checks ride out a broker's restart anyway.
func TestComposeBrokerClientsFollowTheBroker(t *testing.T) {
	t.Parallel()
	checkStacks(t, brokerClientProblems)
	p, err := loadComposeDoc(t, "services:\n  mq:\n    image: rabbitmq:3.13.7-management-alpine\n    labels: {orders.rabbitmq-definitions: a.json}\n"+
		"    healthcheck: {test: [CMD, \"true\"]}\n"+
		"  relay:\n    image: o:1\n    entrypoint: [/usr/local/bin/outbox-relay]\n    depends_on: {mq: {condition: service_healthy}}\n"+
		"    healthcheck: {test: [CMD, /usr/local/bin/outbox-relay, healthcheck], interval: 3s, retries: 10}\n", nil)
	if err != nil {
		t.Fatal(err)
	}
	wantProblems(t, brokerClientProblems(p), []string{`service relay: label orders.rabbitmq-definitions is "", want "a.json"`, "service relay turns unhealthy after 30s of failures"})
}

// brokerReconnect is the longest wait between two of a client's broker
// sessions (background.Reconnect's MaxDelay for the relay and the
// consumers), plus a broker's restart.
const brokerReconnect = 30*time.Second + 20*time.Second

func brokerClientProblems(p *types.Project) []string {
	var problems []string
	for _, name := range serviceNames(p) {
		svc := p.Services[name]
		if !slices.Contains([]string{"outbox-relay", "order-consumer"}, entrypointBinary(svc)) {
			continue
		}
		for dep := range svc.DependsOn {
			broker := p.Services[dep]
			want, labelled := broker.Labels[definitionsLabel]
			if !labelled {
				continue
			}
			if got := svc.Labels[definitionsLabel]; got != want {
				problems = append(problems, fmt.Sprintf("service %s: label %s is %q, want %q, service %s's: else it outlives the broker's restart, reconnecting", name, definitionsLabel, got, want, dep))
			}
		}
		if h := svc.HealthCheck; h != nil && h.Interval != nil && h.Retries != nil {
			if window := time.Duration(*h.Interval) * time.Duration(*h.Retries); window < brokerReconnect {
				problems = append(problems, fmt.Sprintf("service %s turns unhealthy after %s of failures, less than a broker's restart and the reconnect backoff (%s)", name, window, brokerReconnect))
			}
		}
	}
	return problems
}
