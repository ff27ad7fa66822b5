package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"go.yaml.in/yaml/v3"

	"github.com/yourorg/orders/internal/consumer"
	"github.com/yourorg/orders/internal/domain"
	"github.com/yourorg/orders/internal/messaging/inbox"
	"github.com/yourorg/orders/internal/testenv"
)

// asyncAPIDoc generates the AsyncAPI document with q and reads it back.
func asyncAPIDoc(t *testing.T, q queueSettings) map[string]any {
	t.Helper()
	var b bytes.Buffer
	if err := writeAsyncAPI(&b, consumer.All(consumer.Deps{}), q); err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := yaml.Unmarshal(b.Bytes(), &doc); err != nil {
		t.Fatalf("the document is not YAML: %v", err)
	}
	return doc
}

func child(t *testing.T, v any, path ...string) any {
	t.Helper()
	for _, p := range path {
		m, ok := v.(map[string]any)
		if !ok || m[p] == nil {
			t.Fatalf("the document has no %s", strings.Join(path, "/"))
		}
		v = m[p]
	}
	return v
}

// Every message of the catalogue is in the document, and its example
// headers and payload match the schemas the document gives them, as a
// reader of the YAML gets them; a payload without order_id does not.
func TestAsyncAPIExamplesMatchTheDocumentsSchemas(t *testing.T) {
	t.Parallel()
	doc := asyncAPIDoc(t, queueSettings{retryDelays: []time.Duration{time.Second}, deliveryLimit: 20})
	raw, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	resource, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft7) // the dialect of AsyncAPI's schemas
	c.AssertFormat()
	if err := c.AddResource("urn:asyncapi", resource); err != nil {
		t.Fatal(err)
	}
	validate := func(pointer string, value any) error {
		t.Helper()
		s, err := c.Compile("urn:asyncapi#" + pointer)
		if err != nil {
			t.Fatalf("%s: %v", pointer, err)
		}
		b, err := json.Marshal(value)
		if err != nil {
			t.Fatal(err)
		}
		v, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		return s.Validate(v)
	}
	for _, m := range domain.Examples() {
		id := fmt.Sprintf("%s.v%d", m.MessageType(), m.MessageVersion())
		msg := child(t, doc, "components", "messages", id)
		example := child(t, msg, "examples").([]any)[0]
		if err := validate("/components/messages/"+id+"/headers", child(t, example, "headers")); err != nil {
			t.Errorf("%s: the example headers do not match: %v", id, err)
		}
		payload := child(t, example, "payload").(map[string]any)
		if err := validate("/components/schemas/"+id, payload); err != nil {
			t.Errorf("%s: the example payload does not match: %v", id, err)
		}
		delete(payload, "order_id")
		if validate("/components/schemas/"+id, payload) == nil {
			t.Errorf("%s: a payload without order_id matches the schema", id)
		}
		if got := child(t, doc, "channels", m.MessageType(), "messages", id); got == nil {
			t.Errorf("%s is not on the channel of its routing key", id)
		}
	}
}

// The queues of the document are the queues the consumers declare: each
// has the arguments the document gives it (RabbitMQ refuses a declaration
// of an existing queue with other arguments), and each work queue gets the
// messages of exactly the routing keys the document says it binds.
func TestAsyncAPIQueuesAreTheDeclaredOnes(t *testing.T) {
	t.Parallel()
	q := queueSettings{retryDelays: []time.Duration{100 * time.Millisecond, 2 * time.Second}, deliveryLimit: 7}
	doc := asyncAPIDoc(t, q)
	conn, err := amqp.Dial(testenv.NewVhost(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	const partitions = 2
	for _, c := range consumer.All(consumer.Deps{}) {
		topology := inbox.Topology{Consumer: c.Name(), Exchange: domain.EventsExchange, Types: c.Types(), RetryDelays: q.retryDelays, DeliveryLimit: q.deliveryLimit}
		if err := topology.Declare(ch); err != nil {
			t.Fatal(err)
		}
		topology.Partitions = partitions // the partition queues, beside the others
		if err := topology.Declare(ch); err != nil {
			t.Fatal(err)
		}
	}
	queues, bound := 0, map[string]int{} // bindings by queue
	for name, channel := range child(t, doc, "channels").(map[string]any) {
		args, ok := channel.(map[string]any)["x-amqp-arguments"].(map[string]any)
		if !ok {
			continue // a routing key of the exchange
		}
		queues++
		table := amqp.Table{}
		for k, v := range args {
			if n, ok := v.(int); ok {
				v = int64(n)
			}
			table[k] = v
		}
		address := child(t, channel, "address").(string)
		addresses := []string{address}
		if strings.Contains(address, "{partition}") { // one queue per partition
			addresses = nil
			for k := range partitions {
				addresses = append(addresses, strings.ReplaceAll(address, "{partition}", fmt.Sprint(k)))
			}
			ex := child(t, channel, "x-amqp-partition-exchange").(string)
			if err := ch.ExchangeDeclarePassive(ex, amqp.ExchangeHeaders, true, false, false, false, nil); err != nil {
				t.Fatalf("queue %s: its partition exchange %s is not declared: %v", name, ex, err)
			}
		}
		for _, a := range addresses {
			if _, err := ch.QueueDeclare(a, true, false, false, false, table); err != nil {
				t.Fatalf("queue %s: the document's arguments %v are not the declared ones: %v", a, args, err)
			}
		}
		bindings, _ := channel.(map[string]any)["x-amqp-bindings"].([]any)
		for _, b := range bindings {
			if b.(map[string]any)["exchange"] != domain.EventsExchange {
				t.Errorf("queue %s is bound to %v", name, b)
			}
		}
		if len(addresses) == 1 { // the partition queues bind by header, not by routing key
			bound[address] = len(bindings)
		}
	}
	if want := len(consumer.All(consumer.Deps{})) * (3 + len(q.retryDelays)); queues != want {
		t.Errorf("the document has %d queues, want %d", queues, want)
	}

	// One message of each routing key: each queue gets one per binding.
	for _, typ := range domain.MessageTypes() {
		if err := ch.PublishWithContext(t.Context(), domain.EventsExchange, typ, true, false, amqp.Publishing{Body: []byte("{}")}); err != nil {
			t.Fatal(err)
		}
	}
	for name, n := range bound {
		testenv.WaitFor(t, 10*time.Second, fmt.Sprintf("%d messages in %s", n, name), func() bool {
			q, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
			return err == nil && q.Messages == n
		})
	}

	// The check can fail: another delivery limit is refused.
	_, err = ch.QueueDeclare(inbox.QueueName(consumer.Names()[0]), true, false, false, false,
		amqp.Table{"x-queue-type": "quorum", "x-delivery-limit": int64(8)})
	if err == nil {
		t.Fatal("a declaration with another x-delivery-limit was accepted")
	}
}
