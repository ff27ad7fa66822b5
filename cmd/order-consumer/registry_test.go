package main

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	metricnoop "go.opentelemetry.io/otel/metric/noop"

	"github.com/yourorg/orders/internal/config"
	"github.com/yourorg/orders/internal/consumer"
	"github.com/yourorg/orders/internal/domain"
	"github.com/yourorg/orders/internal/messaging"
)

// The tests of this file keep the consumer registry (consumer.Names and
// consumer.Specs), the message types, the CONSUMERS default and the
// documentation in step: each fails on a step of README.md's "Use it as a
// template" left out.

func registry(t *testing.T) []messaging.ConsumerSpec {
	t.Helper()
	specs, err := consumer.Specs(consumer.Names, consumer.Config{MeterProvider: metricnoop.NewMeterProvider()})
	if err != nil {
		t.Fatalf("consumer.Specs(consumer.Names): %v", err)
	}
	if len(specs) != len(consumer.Names) {
		t.Fatalf("consumer.Specs built %d consumers for %d names", len(specs), len(consumer.Names))
	}
	return specs
}

// By default order-consumer runs every consumer there is, and the README and
// .env.example say so.
func TestEveryConsumerRunsByDefault(t *testing.T) {
	t.Parallel()
	var cfg Config
	if err := config.Load(&cfg, map[string]string{}); err != nil {
		t.Fatal(err)
	}
	if !sameSet(cfg.Consumers, consumer.Names) {
		t.Errorf("the CONSUMERS default (envDefault in main.go) is %v; consumer.Names is %v", cfg.Consumers, consumer.Names)
	}
	def := strings.Join(cfg.Consumers, ",")
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if row := "| `CONSUMERS` | `" + def + "` |"; !strings.Contains(string(readme), row) {
		t.Errorf("README.md's configuration table has no row %q", row)
	}
	env, err := os.ReadFile("../../.env.example")
	if err != nil {
		t.Fatal(err)
	}
	if line := "CONSUMERS=" + def; !slices.Contains(strings.Split(string(env), "\n"), line) {
		t.Errorf(".env.example has no line %q", line)
	}
}

// Every message type is bound to at least one consumer's queue, and every
// consumer binds only message types there are. A type no queue is bound to
// would come back from the broker as unroutable on every publish, and the
// relay would end up marking its outbox rows FAILED.
func TestEveryMessageTypeHasAConsumer(t *testing.T) {
	t.Parallel()
	bound := map[string]bool{}
	for _, s := range registry(t) {
		for _, typ := range s.Types {
			if !domain.KnownMessageType(typ) {
				t.Errorf("consumer %s is bound to %q, which is not a message type (domain.MessageTypes)", s.Name, typ)
			}
			bound[typ] = true
		}
	}
	for _, typ := range domain.MessageTypes() {
		if !bound[typ] {
			t.Errorf("no consumer handles %s: add it to the Types of the consumer that reads it", typ)
		}
	}
}

// docs/messaging.md has a row for every consumer in its consumers table,
// naming every message type the consumer handles, and its topology diagram
// binds each consumer's queue to those types.
func TestEveryConsumerIsDocumented(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../../docs/messaging.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	handles := consumersTable(doc)
	if len(handles) == 0 {
		t.Fatal(`docs/messaging.md: no table with the header "| consumer | handles |"`)
	}
	for _, s := range registry(t) {
		cell, ok := handles[s.Name]
		if !ok {
			t.Errorf("docs/messaging.md: the consumers table has no row for `%s`", s.Name)
			continue
		}
		for _, typ := range s.Types {
			if !strings.Contains(cell, "`"+typ+"`") {
				t.Errorf("docs/messaging.md: the consumers table does not list `%s` among what %s handles", typ, s.Name)
			}
		}
		edge := regexp.MustCompile(`--\s*"([^"]*)"\s*-->\s*\w+\[` + regexp.QuoteMeta(messaging.QueueName(s.Name)) + `[<\]]`)
		m := edge.FindStringSubmatch(doc)
		if m == nil {
			t.Errorf("docs/messaging.md: the topology diagram has no binding into %s", messaging.QueueName(s.Name))
			continue
		}
		for _, typ := range s.Types {
			if !strings.Contains(m[1], typ) {
				t.Errorf("docs/messaging.md: the topology diagram's binding into %s does not name %s", messaging.QueueName(s.Name), typ)
			}
		}
	}
	for name := range handles {
		if !slices.Contains(consumer.Names, name) {
			t.Errorf("docs/messaging.md: the consumers table has a row for %s, which is not in consumer.Names", name)
		}
	}
}

// consumersTable reads the table of docs/messaging.md whose header starts
// "| consumer | handles |" and returns, for each consumer, its "handles"
// cells (a row with an empty first cell continues the consumer above).
func consumersTable(doc string) map[string]string {
	handles := map[string]string{}
	in, current := false, ""
	for line := range strings.Lines(doc) {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "|") {
			if in {
				break
			}
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		switch {
		case len(cells) >= 2 && cells[0] == "consumer" && cells[1] == "handles":
			in = true
			continue
		case !in || len(cells) < 2 || strings.Trim(cells[0], "-: ") == "" && strings.Trim(cells[1], "-: ") == "":
			continue
		}
		if cells[0] != "" {
			current = strings.Trim(cells[0], "`")
		}
		handles[current] += " " + cells[1]
	}
	return handles
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}
