package inbox_test

import (
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/yourorg/orders/internal/messaging/inbox"
	"github.com/yourorg/orders/internal/testenv"
)

// A consumer that has declared its queues and not bound them yet is one
// the relay binds (Topology.Readers, outbox.Config.Readers): the relay's
// bindings alone route each message to the queue Declare's would, with
// partitions too.
func TestReadersBindTheRoutesDeclareBinds(t *testing.T) {
	t.Parallel()
	conn, err := amqp.Dial(testenv.NewVhost(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	const typ = "order.cancelled"
	for _, partitions := range []int{0, 3} {
		top := inbox.Topology{Consumer: fmt.Sprintf("late%d", partitions), Exchange: "orders.events", Types: []string{typ},
			RetryDelays: []time.Duration{time.Second}, DeliveryLimit: 5, Partitions: partitions}
		if err := top.Declare(ch); err != nil {
			t.Fatal(err)
		}
		// Declared, not bound: undo the bindings Declare made.
		if partitions == 0 {
			err = ch.QueueUnbind(top.Queue(), typ, top.Exchange, nil)
		} else {
			err = ch.ExchangeUnbind(top.PartitionExchange(), typ, top.Exchange, false, nil)
			for k, q := range top.WorkQueues() {
				if err == nil {
					err = ch.QueueUnbind(q, "", top.PartitionExchange(), amqp.Table{"x-match": "all", "partition": int32(k)})
				}
			}
		}
		if err != nil {
			t.Fatal(err)
		}
		publish := func() {
			t.Helper()
			for k := range top.WorkQueues() {
				msg := amqp.Publishing{Body: []byte("{}"), Headers: amqp.Table{"partition": int32(k)}}
				if err := ch.PublishWithContext(t.Context(), top.Exchange, typ, false, false, msg); err != nil {
					t.Fatal(err)
				}
			}
		}
		depths := func() []int {
			t.Helper()
			var d []int
			for _, q := range top.WorkQueues() {
				got, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
				if err != nil {
					t.Fatal(err)
				}
				d = append(d, got.Messages)
			}
			return d
		}
		publish() // unbound: lost for this consumer
		readers := top.Readers()[typ]
		if len(readers) != len(top.WorkQueues()) {
			t.Fatalf("partitions %d: %d readers of %s, want one per work queue", partitions, len(readers), typ)
		}
		for _, r := range readers {
			if err := r.Bind(ch, typ); err != nil {
				t.Fatal(err)
			}
		}
		publish()
		want := fmt.Sprint(ones(len(top.WorkQueues())))
		testenv.WaitFor(t, 5*time.Second, "one message in each work queue", func() bool { return fmt.Sprint(depths()) == want })
		time.Sleep(200 * time.Millisecond) // nothing more comes
		if got := fmt.Sprint(depths()); got != want {
			t.Fatalf("partitions %d: depths %s, want %s", partitions, got, want)
		}
	}
}

func ones(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = 1
	}
	return s
}
