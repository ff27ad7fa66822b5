package inbox_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/yourorg/orders/internal/messaging/inbox"
	"github.com/yourorg/orders/internal/testenv"
)

// The failure windows of the consumers that lose nothing, stall nothing
// and park nothing only because of a mechanism built for them; each test
// here fails without it.

// The broker cancels the consumer (here: its work queue is deleted, as an
// operator's mistake or a queue re-declaration would). The consumer is not
// ready while it is not consuming, declares its topology again, and the
// messages published after that are processed.
func TestCancelledConsumerComesBack(t *testing.T) {
	t.Parallel()
	b := setupConsumer(t)
	rc := b.start(testConsumerConfig(), b.amqpURL, nil)
	if _, err := b.ch.QueueDelete(inbox.QueueName(testConsumer), false, false, false); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "the cancelled consumer to say it is not ready", func() bool { return rc.Ready(b.ctx) != nil })
	testenv.WaitFor(t, 30*time.Second, "the consumer to come back", func() bool { return rc.Ready(b.ctx) == nil })
	msg := message()
	b.publish(msg)
	if row := b.waitInbox(msg.MessageId, inbox.StatusProcessed); row.Attempts != 1 || b.effects(msg.MessageId) != 1 {
		t.Fatalf("after the comeback: %+v, %d effects", row, b.effects(msg.MessageId))
	}
}

// The channel the consumer publishes its retries and parkings on dies
// (the broker closes a channel on a refused publish). The next retry
// reopens it: the message goes round the retry queue and succeeds, instead
// of being given back to the broker again and again.
func TestDeadPublisherChannelIsReplaced(t *testing.T) {
	t.Parallel()
	b := setupConsumer(t)
	rc := b.start(testConsumerConfig(), b.amqpURL, nil)
	inbox.KillPublisherChannels(rc.Consumers)
	msg := message()
	b.handler.set(func(h *effectHandler) { h.failures[msg.MessageId] = 1 }) // one transient failure: a retry
	b.publish(msg)
	row := b.waitInbox(msg.MessageId, inbox.StatusProcessed)
	if row.Attempts != 2 || b.effects(msg.MessageId) != 1 {
		t.Fatalf("after the retry: %+v, %d effects", row, b.effects(msg.MessageId))
	}
	if got := b.counter("consumer.messages.requeued"); got != 0 {
		t.Fatalf("%d deliveries given back to the broker; the retry should have gone through a new channel", got)
	}
}

// The database answers pings but takes no writes (a read-only standby
// after a failover, or a database made read-only): the consumer holds its
// deliveries, unacknowledged, instead of sending them round the broker into
// the queue's delivery limit; it says it is not ready; nothing reaches the
// parking lot; and once writes work again every message is applied once.
func TestReadOnlyDatabaseHoldsDeliveries(t *testing.T) {
	t.Parallel()
	b := setupConsumer(t)
	cfg := testConsumerConfig()
	cfg.DeliveryLimit = 2 // the broker would park a message after 2 redeliveries
	rc := b.start(cfg, b.amqpURL, nil)
	b.setReadOnly(true)

	var msgs []amqp.Publishing
	for range 6 {
		msg := message()
		msgs = append(msgs, msg)
		b.publish(msg)
	}
	testenv.WaitFor(t, 15*time.Second, "the consumer to hold its deliveries", func() bool {
		err := rc.Ready(b.ctx)
		return err != nil && strings.Contains(err.Error(), "takes no writes")
	})
	time.Sleep(3 * time.Second) // long enough for many redeliveries, if there were any
	if n := b.ready(inbox.ParkingLotName(inbox.QueueName(testConsumer))); n != 0 {
		t.Fatalf("%d messages parked while the database was read-only", n)
	}
	if got := b.counter("consumer.messages.redelivered"); got != 0 {
		t.Fatalf("%d redeliveries while the database was read-only; the deliveries should be held", got)
	}
	if got := b.counter("consumer.messages.held"); got == 0 {
		t.Fatal("consumer.messages.held is 0")
	}

	b.setReadOnly(false)
	for _, msg := range msgs {
		if row := b.waitInbox(msg.MessageId, inbox.StatusProcessed); row.Attempts != 1 || b.effects(msg.MessageId) != 1 {
			t.Fatalf("message %s: %+v, %d effects", msg.MessageId, row, b.effects(msg.MessageId))
		}
	}
	testenv.WaitFor(t, 10*time.Second, "the consumer to be ready again", func() bool { return rc.Ready(b.ctx) == nil })
}

// PostgreSQL goes away under a running consumer (its connections cut, and
// new ones refused, by a proxy). Deliveries are held, not redelivered or
// parked; when it is back, each message is applied once.
func TestDatabaseGoneUnderRunningConsumer(t *testing.T) {
	t.Parallel()
	b := setupConsumer(t)
	proxy := testenv.NewProxy(t, testenv.HostPort(b.dbURL))
	b.consumerDB = proxy.Rewrite(b.dbURL)
	cfg := testConsumerConfig()
	cfg.DeliveryLimit = 2
	cfg.TxTimeout = time.Second
	rc := b.start(cfg, b.amqpURL, nil)

	proxy.Cut()
	var msgs []amqp.Publishing
	for range 5 {
		msg := message()
		msgs = append(msgs, msg)
		b.publish(msg)
	}
	testenv.WaitFor(t, 15*time.Second, "the consumer to hold its deliveries", func() bool { return b.counter("consumer.messages.held") > 0 })
	time.Sleep(2 * time.Second)
	if n := b.ready(inbox.ParkingLotName(inbox.QueueName(testConsumer))); n != 0 {
		t.Fatalf("%d messages parked while the database was away", n)
	}
	if rc.Ready(b.ctx) == nil {
		t.Fatal("ready while the database is away")
	}
	proxy.Restore()
	for _, msg := range msgs {
		if row := b.waitInbox(msg.MessageId, inbox.StatusProcessed); row.Attempts != 1 || b.effects(msg.MessageId) != 1 {
			t.Fatalf("message %s: %+v, %d effects", msg.MessageId, row, b.effects(msg.MessageId))
		}
	}
	if got := b.counter("consumer.messages.redelivered"); got != 0 {
		t.Fatalf("%d redeliveries while the database was away", got)
	}
}

// A message the broker parks on its own, after the work queue's delivery
// limit (here: a client that takes it and gives it back, again and again),
// is recognisable in the parking lot, and replaying it gives it a fresh
// start: the consumer processes it.
func TestDeliveryLimitParksRecognisablyAndReplays(t *testing.T) {
	t.Parallel()
	b := setupConsumer(t)
	cfg := testConsumerConfig()
	topo := inbox.Topology{Consumer: testConsumer, Types: []string{message().Type}, RetryDelays: cfg.RetryDelays, DeliveryLimit: cfg.DeliveryLimit}
	if err := topo.Declare(b.ch); err != nil {
		t.Fatal(err)
	}
	msg := message()
	b.publish(msg)
	// A crashing consumer: takes the message and gives it back, until the
	// broker dead-letters it.
	queue, dlq := inbox.QueueName(testConsumer), inbox.ParkingLotName(inbox.QueueName(testConsumer))
	for i := 0; b.ready(dlq) == 0; i++ {
		if i > 20 {
			t.Fatal("the broker never dead-lettered the message")
		}
		d, ok, err := b.ch.Get(queue, false)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			if err := d.Nack(false, true); err != nil {
				t.Fatal(err)
			}
		} else {
			time.Sleep(100 * time.Millisecond)
		}
	}
	d, ok, err := b.ch.Get(dlq, false)
	if err != nil || !ok {
		t.Fatalf("get from the parking lot: %v, %v", ok, err)
	}
	code, reason := inbox.ParkedReason(d.Headers)
	if code != "delivery_limit" || !strings.Contains(reason, "CONSUMER_DELIVERY_LIMIT") {
		t.Fatalf("ParkedReason = %q, %q; want delivery_limit", code, reason)
	}
	if err := d.Nack(false, true); err != nil {
		t.Fatal(err)
	}

	b.start(cfg, b.amqpURL, nil)
	moved, err := inbox.Replay(b.ctx, b.amqpURL, testConsumer, inbox.ReplayRequest{Limit: 10})
	if err != nil || len(moved) != 1 {
		t.Fatalf("replay moved %v, %v", moved, err)
	}
	if row := b.waitInbox(msg.MessageId, inbox.StatusProcessed); b.effects(msg.MessageId) != 1 {
		t.Fatalf("after the replay: %+v, %d effects", row, b.effects(msg.MessageId))
	}
}

// setReadOnly makes the test's database read-only (or writable again) for
// new transactions, and cuts the consumers' sessions so that they pick the
// setting up, as a failover to a standby would.
func (b *consumerBundle) setReadOnly(on bool) {
	b.t.Helper()
	db := b.pool.Config().ConnConfig.Database
	admin, err := pgx.Connect(b.ctx, testenv.ServerURL(b.t, "postgres"))
	if err != nil {
		b.t.Fatal(err)
	}
	defer admin.Close(b.ctx)
	if _, err := admin.Exec(b.ctx, fmt.Sprintf("ALTER DATABASE %s SET default_transaction_read_only = %v", db, on)); err != nil {
		b.t.Fatal(err)
	}
	if _, err := admin.Exec(b.ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND application_name = 'consumer-under-test'", db); err != nil {
		b.t.Fatal(err)
	}
}
