package inbox

import (
	"fmt"
	"maps"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/yourorg/orders/internal/messaging"
	"github.com/yourorg/orders/internal/messaging/outbox"
)

// The queues of a consumer named N (docs/messaging.md draws them):
//
//	orders.N             its work queue: a quorum queue bound to the exchange
//	                     for N's message types, with an explicit delivery limit
//	orders.N.retry.<d>   one per retry delay d: no consumer; a message waits
//	                     there d (x-message-ttl), then dead-letters back to
//	                     orders.N
//	orders.N.dlq         the parking lot: messages that cannot be handled,
//	                     with headers saying why; also where the broker puts
//	                     a message redelivered more than the delivery limit
//
// With partitions (Config.Partitions = P), instead of orders.N and its
// retry queues:
//
//	orders.N.partitions  a headers exchange bound to the exchange for N's
//	                     message types, which routes each message by its
//	                     partition header (set by the relays)
//	orders.N.p<k>        k = 0 .. P-1: a quorum queue per partition, with
//	                     single active consumer, the delivery limit and the
//	                     parking lot of orders.N
//
// Declaring is idempotent; every consumer declares its topology at start
// and after every reconnect. A declaration whose arguments differ from the
// queue's (a changed delivery limit, say) fails with PRECONDITION_FAILED.

// QueueName is the work queue of consumer name.
func QueueName(consumer string) string { return "orders." + consumer }

// ParkingLotName is the parking-lot queue of a work queue.
func ParkingLotName(queue string) string { return queue + ".dlq" }

// Topology describes the queues of one consumer.
type Topology struct {
	Consumer      string
	Exchange      string          // the topic exchange its queue is bound to
	Types         []string        // the message types it is bound to
	RetryDelays   []time.Duration // the delayed-retry steps, shortest first
	DeliveryLimit int             // x-delivery-limit of the work queue
	Partitions    int             // 0: one work queue; else one per partition
}

// Queue is the consumer's work queue.
func (t Topology) Queue() string { return QueueName(t.Consumer) }

// WorkQueues lists the queues the consumer consumes: its work queue, or
// with partitions, one per partition.
func (t Topology) WorkQueues() []string {
	if t.Partitions == 0 {
		return []string{t.Queue()}
	}
	queues := make([]string, t.Partitions)
	for k := range queues {
		queues[k] = fmt.Sprintf("orders.%s.p%d", t.Consumer, k)
	}
	return queues
}

// RetryQueue is the queue a message of the work queue waits in for delay.
func (t Topology) RetryQueue(delay time.Duration) string {
	return fmt.Sprintf("%s.retry.%s", t.Queue(), delay)
}

// PartitionExchange is the exchange that routes the consumer's messages
// to its partition queues.
func (t Topology) PartitionExchange() string { return t.Queue() + ".partitions" }

// Declare declares the exchange and the consumer's queues and bindings.
func (t Topology) Declare(ch *amqp.Channel) error {
	if t.Exchange == "" {
		return fmt.Errorf("topology of consumer %s: no exchange to bind its queue to", t.Consumer)
	}
	if err := messaging.DeclareExchange(ch, t.Exchange); err != nil {
		return err
	}
	dlq := ParkingLotName(t.Queue())
	declare := func(name string, args amqp.Table) error {
		args["x-queue-type"] = "quorum"
		if _, err := ch.QueueDeclare(name, true, false, false, false, args); err != nil {
			return fmt.Errorf("declare queue %s: %w", name, err)
		}
		return nil
	}
	workQueue := func(singleActive bool) amqp.Table {
		args := amqp.Table{
			// A message redelivered this often (a consumer crashing on it,
			// or unable to reach the database) goes to the parking lot.
			"x-delivery-limit":          int64(t.DeliveryLimit),
			"x-dead-letter-exchange":    "",
			"x-dead-letter-routing-key": dlq,
			// Dead-letter at least once (not the quorum default, at most once).
			"x-dead-letter-strategy": "at-least-once",
			"x-overflow":             "reject-publish",
		}
		if singleActive {
			args["x-single-active-consumer"] = true
		}
		return args
	}
	if err := declare(dlq, amqp.Table{}); err != nil {
		return err
	}
	if t.Partitions > 0 {
		return t.declarePartitions(ch, declare, workQueue(true))
	}
	queue := t.Queue()
	if err := declare(queue, workQueue(false)); err != nil {
		return err
	}
	for _, d := range t.RetryDelays {
		if err := declare(t.RetryQueue(d), amqp.Table{
			"x-message-ttl":             d.Milliseconds(),
			"x-dead-letter-exchange":    "",
			"x-dead-letter-routing-key": queue,
			"x-dead-letter-strategy":    "at-least-once",
			"x-overflow":                "reject-publish",
		}); err != nil {
			return err
		}
	}
	for _, typ := range t.Types {
		if err := t.bindType(ch, typ); err != nil {
			return err
		}
	}
	return nil
}

// bindType binds the consumer's work queue (with partitions, its partition
// exchange) to the exchange for message type typ.
func (t Topology) bindType(ch *amqp.Channel, typ string) error {
	if t.Partitions > 0 {
		ex := t.PartitionExchange()
		if err := ch.ExchangeBind(ex, typ, t.Exchange, false, nil); err != nil {
			return fmt.Errorf("bind %s to %s for %s: %w", ex, t.Exchange, typ, err)
		}
		return nil
	}
	if err := ch.QueueBind(t.Queue(), typ, t.Exchange, false, nil); err != nil {
		return fmt.Errorf("bind %s to %s: %w", t.Queue(), typ, err)
	}
	return nil
}

// bindPartition binds partition queue k to the partition exchange, by its
// partition number. The partition header is an int32
// (outbox.HeaderPartition): a headers exchange matches the value and its
// type.
func (t Topology) bindPartition(ch *amqp.Channel, k int) error {
	queue := t.WorkQueues()[k]
	if err := ch.QueueBind(queue, "", t.PartitionExchange(), false, amqp.Table{"x-match": "all", "partition": int32(k)}); err != nil {
		return fmt.Errorf("bind %s to partition %d: %w", queue, k, err)
	}
	return nil
}

// Readers lists, by message type, the consumer's work queues (with
// partitions, its partition queues), each with the bindings Declare makes
// for it: the relay makes them again before it publishes the type
// (outbox.Config.Readers), so that a message published between this
// consumer's declare and its bind still reaches it. The same code binds
// for both, so the relay's bindings are the consumer's, not new ones.
func (t Topology) Readers() map[string][]outbox.Reader {
	readers := map[string][]outbox.Reader{}
	for _, typ := range t.Types {
		for k, queue := range t.WorkQueues() {
			readers[typ] = append(readers[typ], outbox.Reader{Queue: queue, Bind: func(ch *amqp.Channel, typ string) error {
				if err := t.bindType(ch, typ); err != nil || t.Partitions == 0 {
					return err
				}
				return t.bindPartition(ch, k)
			}})
		}
	}
	return readers
}

// declarePartitions declares the partition exchange of the consumer,
// bound to its message types, and its partition queues, each bound to
// its partition number.
func (t Topology) declarePartitions(ch *amqp.Channel, declare func(string, amqp.Table) error, args amqp.Table) error {
	ex := t.PartitionExchange()
	if err := ch.ExchangeDeclare(ex, amqp.ExchangeHeaders, true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare exchange %s: %w", ex, err)
	}
	for _, typ := range t.Types {
		if err := t.bindType(ch, typ); err != nil {
			return err
		}
	}
	for k, queue := range t.WorkQueues() {
		if err := declare(queue, maps.Clone(args)); err != nil {
			return err
		}
		if err := t.bindPartition(ch, k); err != nil {
			return err
		}
	}
	return nil
}

// retryDelay is the wait before the retry after attempt (1-based): the
// delays grow with the attempts, and the last one repeats.
func (w *worker) retryDelay(attempt int) time.Duration {
	d := w.cfg.RetryDelays
	return d[min(max(attempt, 1), len(d))-1]
}

// retryQueueAfter is the queue for the retry after attempt (1-based): the
// delays grow with the attempts, and the last one repeats.
func (t Topology) retryQueueAfter(attempt int) string {
	i := min(max(attempt, 1), len(t.RetryDelays)) - 1
	return t.RetryQueue(t.RetryDelays[i])
}

// topology is the topology of consumer c under cfg.
func (c Config) topology(consumer *Consumer) Topology {
	return Topology{Consumer: consumer.name, Exchange: c.Exchange, Types: consumer.Types(), RetryDelays: c.RetryDelays,
		DeliveryLimit: c.DeliveryLimit, Partitions: c.Partitions}
}
