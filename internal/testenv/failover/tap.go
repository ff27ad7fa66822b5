package failover

import (
	"encoding/json"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/yourorg/orders/internal/domain"
)

// Tapped is a message the tap received.
type Tapped struct {
	ID, Type, OrderID string
	At                time.Time // when the tap received it: as good as when it was published
}

// Tap is a queue of the caller's own bound to every routing key of the
// events exchange: it receives a copy of every message the relay
// publishes, whatever happens to the consumers' queues.
type Tap struct {
	conn *amqp.Connection
	done chan struct{}
	mu   sync.Mutex
	msgs []Tapped
}

// StartTap binds a tap on the vhost of amqpURL, which has the events
// exchange (a consumer declared it). t's cleanup stops it.
func StartTap(t testing.TB, amqpURL string) *Tap {
	t.Helper()
	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	tp := &Tap{conn: conn, done: make(chan struct{})}
	ch, err := conn.Channel()
	if err != nil {
		_ = conn.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { tp.Stop() })
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(q.Name, "#", domain.EventsExchange, false, nil); err != nil {
		t.Fatal(err)
	}
	deliveries, err := ch.Consume(q.Name, "", true, true, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(tp.done)
		for d := range deliveries {
			var body struct {
				OrderID string `json:"order_id"`
			}
			_ = json.Unmarshal(d.Body, &body)
			tp.mu.Lock()
			tp.msgs = append(tp.msgs, Tapped{ID: d.MessageId, Type: d.Type, OrderID: body.OrderID, At: time.Now()})
			tp.mu.Unlock()
		}
	}()
	return tp
}

// Stop closes the tap's connection and returns what it received, in the
// order received (a message published again appears again).
func (tp *Tap) Stop() []Tapped {
	_ = tp.conn.Close()
	<-tp.done
	tp.mu.Lock()
	defer tp.mu.Unlock()
	return tp.msgs
}
