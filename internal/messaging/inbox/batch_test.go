package inbox_test

import (
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/yourorg/orders/internal/messaging/inbox"
	"github.com/yourorg/orders/internal/testenv"
)

// A backlog is applied in batches: fewer transactions than messages (each
// effect row records the transaction that wrote it), and each message
// applied exactly once, with its own inbox row.
func TestBatchesApplyEachMessageOnce(t *testing.T) {
	t.Parallel()
	b := setupConsumer(t)
	cfg := testConsumerConfig()
	cfg.Workers, cfg.Prefetch, cfg.BatchSize = 1, 64, 16
	cfg.BatchWait = 50 * time.Millisecond // batches however slow the machine
	topo := inbox.Topology{Consumer: testConsumer, Types: []string{message().Type}, RetryDelays: cfg.RetryDelays, DeliveryLimit: cfg.DeliveryLimit}
	if err := topo.Declare(b.ch); err != nil {
		t.Fatal(err)
	}
	var msgs []amqp.Publishing
	for range 64 { // waiting in the queue before the consumer starts
		msg := message()
		msgs = append(msgs, msg)
		b.publish(msg)
	}
	b.start(cfg, b.amqpURL, nil)
	for _, msg := range msgs {
		if row := b.waitInbox(msg.MessageId, inbox.StatusProcessed); row.Attempts != 1 || b.effects(msg.MessageId) != 1 {
			t.Fatalf("message %s: %+v, %d effects", msg.MessageId, row, b.effects(msg.MessageId))
		}
	}
	var transactions int
	if err := b.pool.QueryRow(b.ctx, "SELECT count(DISTINCT txid) FROM test_effect").Scan(&transactions); err != nil {
		t.Fatal(err)
	}
	if transactions >= len(msgs) {
		t.Fatalf("%d transactions for %d messages: no batching", transactions, len(msgs))
	}
	var followUps int
	if err := b.pool.QueryRow(b.ctx, "SELECT count(*) FROM message_outbox").Scan(&followUps); err != nil || followUps != len(msgs) {
		t.Fatalf("%d follow-up messages (%v), want one per message", followUps, err)
	}
}

// A poison message inside a batch takes nobody down with it: the batch
// rolls back, each delivery is applied again on its own, the others are
// applied once, and the poison is parked with its reason.
func TestPoisonInsideABatch(t *testing.T) {
	t.Parallel()
	b := setupConsumer(t)
	cfg := testConsumerConfig()
	cfg.Workers, cfg.Prefetch, cfg.BatchSize = 1, 32, 16
	cfg.BatchWait = 50 * time.Millisecond
	topo := inbox.Topology{Consumer: testConsumer, Types: []string{message().Type}, RetryDelays: cfg.RetryDelays, DeliveryLimit: cfg.DeliveryLimit}
	if err := topo.Declare(b.ch); err != nil {
		t.Fatal(err)
	}
	var msgs []amqp.Publishing
	for range 12 {
		msgs = append(msgs, message())
	}
	poison := msgs[5]
	b.handler.set(func(h *effectHandler) { h.permanent = map[string]bool{poison.MessageId: true} })
	for _, msg := range msgs {
		b.publish(msg)
	}
	b.start(cfg, b.amqpURL, nil)
	for _, msg := range msgs {
		if msg.MessageId == poison.MessageId {
			continue
		}
		if row := b.waitInbox(msg.MessageId, inbox.StatusProcessed); b.effects(msg.MessageId) != 1 {
			t.Fatalf("message %s: %+v, %d effects", msg.MessageId, row, b.effects(msg.MessageId))
		}
	}
	parked := b.parked(1)
	if parked[0].MessageId != poison.MessageId || parked[0].Headers[inbox.HeaderParkedCode] != "test_permanent" {
		t.Fatalf("parked %s (%v), want the poison with its reason", parked[0].MessageId, parked[0].Headers[inbox.HeaderParkedCode])
	}
	if n := b.effects(poison.MessageId); n != 0 {
		t.Fatalf("the poison left %d effects", n)
	}
}

// A batch cut off after its commit and before its acks (the broker
// connection dies right then): every message of it comes back, each is
// recognised as a duplicate, and every effect exists once.
func TestBatchCrashAfterCommitBeforeAck(t *testing.T) {
	t.Parallel()
	b := setupConsumer(t)
	cfg := testConsumerConfig()
	cfg.Workers, cfg.Prefetch, cfg.BatchSize = 1, 32, 16
	cfg.BatchWait = time.Second // the whole backlog in the first batch
	topo := inbox.Topology{Consumer: testConsumer, Types: []string{message().Type}, RetryDelays: cfg.RetryDelays, DeliveryLimit: cfg.DeliveryLimit}
	if err := topo.Declare(b.ch); err != nil {
		t.Fatal(err)
	}
	var msgs []amqp.Publishing
	for range 10 {
		msg := message()
		msgs = append(msgs, msg)
		b.publish(msg)
	}
	proxy := testenv.NewProxy(t, testenv.HostPort(b.amqpURL))
	var cut atomic.Bool
	b.start(cfg, proxy.Rewrite(b.amqpURL), func(cs *inbox.Consumers) {
		inbox.SetAfterCommit(cs, func(*inbox.Delivery) {
			if cut.CompareAndSwap(false, true) {
				proxy.Cut() // before the first ack of the committed batch
				go func() { time.Sleep(300 * time.Millisecond); proxy.Restore() }()
			}
		})
	})
	testenv.WaitFor(t, 30*time.Second, "the redeliveries to be recognised", func() bool {
		return b.counter("consumer.messages.duplicates") >= int64(len(msgs))-1 // the first ack may be out before the cut
	})
	for _, msg := range msgs {
		if row := b.waitInbox(msg.MessageId, inbox.StatusProcessed); b.effects(msg.MessageId) != 1 {
			t.Fatalf("message %s: %+v, %d effects", msg.MessageId, row, b.effects(msg.MessageId))
		}
	}
	var transactions int
	if err := b.pool.QueryRow(b.ctx, "SELECT count(DISTINCT txid) FROM test_effect").Scan(&transactions); err != nil || transactions != 1 {
		t.Fatalf("%d transactions for %d messages (%v): want the cut batch to be one", transactions, len(msgs), err)
	}
}
