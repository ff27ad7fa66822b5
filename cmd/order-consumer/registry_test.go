package main

import (
	"os"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/yourorg/orders/api"
	"github.com/yourorg/orders/internal/config"
	"github.com/yourorg/orders/internal/consumer"
	"github.com/yourorg/orders/internal/domain"
	"github.com/yourorg/orders/internal/messaging/inbox"
	"github.com/yourorg/orders/internal/testenv"
)

// The tests of this file keep the consumer registry (consumer.All), the
// message types, the CONSUMERS default and the documentation in step, so
// that adding a consumer is its folder, its migration and one line in
// consumer.All (docs/extending.md), and nothing else can fall behind.

// By default order-consumer runs every consumer there is, and neither the
// configuration page nor .env.example lists them (a list there would fall
// behind the first consumer a team adds).
func TestEveryConsumerRunsByDefault(t *testing.T) {
	t.Parallel()
	var cfg Config
	if err := config.Load(&cfg, map[string]string{}); err != nil {
		t.Fatal(err)
	}
	all := consumer.All(consumer.Deps{})
	selected, err := consumer.Select(all, cfg.Consumers)
	if err != nil || len(selected) != len(all) {
		t.Fatalf("the CONSUMERS default %v selects %d of %d consumers (%v)", cfg.Consumers, len(selected), len(all), err)
	}
	page, err := os.ReadFile("../../" + testenv.ConfigurationPage)
	if err != nil {
		t.Fatal(err)
	}
	env, err := os.ReadFile("../../.env.example")
	if err != nil {
		t.Fatal(err)
	}
	rows := 0
	for line := range strings.Lines(string(page)) {
		if strings.HasPrefix(line, "| `CONSUMERS` |") {
			rows++
			for _, name := range consumer.Names() {
				if strings.Contains(line, name) {
					t.Errorf("%s's CONSUMERS row names %s: say \"every consumer\" instead of listing them", testenv.ConfigurationPage, name)
				}
			}
		}
	}
	if rows != 1 {
		t.Errorf("%s has %d rows for CONSUMERS, want 1", testenv.ConfigurationPage, rows)
	}
	for line := range strings.Lines(string(env)) {
		if strings.HasPrefix(line, "CONSUMERS=") && strings.TrimSpace(line) != "CONSUMERS=" {
			t.Errorf(".env.example sets %q: leave CONSUMERS empty (every consumer)", strings.TrimSpace(line))
		}
	}
}

// Every message type is read by at least one consumer, and every consumer
// reads only message types there are. A type no queue is bound to would
// come back from the broker as unroutable on every publish, and the relay
// would end up marking its outbox rows FAILED.
func TestEveryMessageTypeHasAConsumer(t *testing.T) {
	t.Parallel()
	read := map[string]bool{}
	for _, c := range consumer.All(consumer.Deps{}) {
		if len(c.Types()) == 0 {
			t.Errorf("consumer %s registers no handler", c.Name())
		}
		for _, typ := range c.Types() {
			if !domain.KnownMessageType(typ) {
				t.Errorf("consumer %s reads %q, which is not a message type (domain.MessageTypes)", c.Name(), typ)
			}
			read[typ] = true
		}
	}
	for _, typ := range domain.MessageTypes() {
		if !read[typ] {
			t.Errorf("no consumer reads %s: register a handler for it (inbox.Handle) in the consumer that reads it", typ)
		}
	}
}

// Consumer names are unique: each is a consumer_name in the inbox and the
// name of a queue.
func TestConsumerNamesAreUnique(t *testing.T) {
	t.Parallel()
	names := consumer.Names()
	if len(slices.Compact(slices.Sorted(slices.Values(names)))) != len(names) {
		t.Fatalf("consumer names %v repeat", names)
	}
}

// api/asyncapi.yaml states the queue settings of order-consumer's
// defaults. Its generator (api/internal/gen) cannot import this package,
// so it writes them down again; this holds the two together.
func TestAsyncAPIStatesTheDefaultQueues(t *testing.T) {
	t.Parallel()
	var cfg Config
	if err := config.Load(&cfg, map[string]string{}); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Channels map[string]struct {
			Arguments map[string]any `yaml:"x-amqp-arguments"`
		} `yaml:"channels"`
	}
	if err := yaml.Unmarshal(api.AsyncAPI, &doc); err != nil {
		t.Fatal(err)
	}
	for _, c := range consumer.All(consumer.Deps{}) {
		queue := inbox.QueueName(c.Name())
		if got := doc.Channels[queue].Arguments["x-delivery-limit"]; got != cfg.DeliveryLimit {
			t.Errorf("api/asyncapi.yaml: %s has the delivery limit %v, CONSUMER_DELIVERY_LIMIT's default is %d", queue, got, cfg.DeliveryLimit)
		}
		var want, got []string
		for _, d := range cfg.RetryDelays {
			want = append(want, inbox.Topology{Consumer: c.Name()}.RetryQueue(d))
		}
		for name := range doc.Channels {
			if strings.HasPrefix(name, queue+".retry.") {
				got = append(got, name)
			}
		}
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("api/asyncapi.yaml: the retry queues of %s are %v, CONSUMER_RETRY_DELAYS's default makes %v", queue, got, want)
		}
	}
}
