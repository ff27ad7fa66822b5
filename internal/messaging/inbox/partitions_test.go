package inbox_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/yourorg/orders/internal/messaging/inbox"
	"github.com/yourorg/orders/internal/messaging/inbox/inboxadmin"
	"github.com/yourorg/orders/internal/testenv"
)

// Partitioned consumers keep the messages of each aggregate in order.

const testPartitions = 4

// partitioned is a message of aggregate with the partition header the
// relay would give it.
func (b *consumerBundle) partitioned(aggregate uuid.UUID) amqp.Publishing {
	b.t.Helper()
	var p int32
	if err := b.pool.QueryRow(b.ctx, `SELECT outbox_partition($1, $2)`, aggregate.String(), testPartitions).Scan(&p); err != nil {
		b.t.Fatal(err)
	}
	msg := message()
	msg.Body = []byte(fmt.Sprintf(`{"id":%q}`, aggregate))
	msg.Headers["partition"] = p
	return msg
}

// appliedOrder lists the messages of ids in the order their effects were
// written.
func (b *consumerBundle) appliedOrder(ids []string) []string {
	b.t.Helper()
	rows, err := b.pool.Query(b.ctx, `SELECT message_id FROM test_effect WHERE message_id = ANY ($1) ORDER BY seq`, ids)
	if err != nil {
		b.t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		b.t.Fatal(err)
	}
	return got
}

func partitionedConfig() inbox.Config {
	cfg := testConsumerConfig()
	cfg.Partitions = testPartitions
	cfg.RetryDelays = []time.Duration{50 * time.Millisecond, 100 * time.Millisecond}
	return cfg
}

// A transient failure is retried in place: the later messages of its
// aggregate wait for it (a trip through a retry queue would let them
// overtake it), and every message of the aggregate is applied once, in the
// order it was published.
func TestPartitionedConsumerRetriesInPlaceAndKeepsOrder(t *testing.T) {
	t.Parallel()
	b := setupConsumer(t)
	b.start(partitionedConfig(), b.amqpURL, nil)
	aggregate := uuid.New()
	var ids []string
	for i := range 5 {
		msg := b.partitioned(aggregate)
		if i == 0 {
			b.handler.set(func(h *effectHandler) { h.failures[msg.MessageId] = 2 }) // twice, then it works
		}
		ids = append(ids, msg.MessageId)
		b.publish(msg)
	}
	for _, id := range ids {
		b.waitInbox(id, inbox.StatusProcessed)
	}
	if got := b.appliedOrder(ids); !slices.Equal(got, ids) {
		t.Fatalf("applied %v, want %v", got, ids)
	}
	if got := b.counter("consumer.messages.retried"); got != 2 {
		t.Fatalf("consumer.messages.retried = %d, want 2", got)
	}
	if n := b.ready(inbox.ParkingLotName(inbox.QueueName(testConsumer))); n != 0 {
		t.Fatalf("%d parked", n)
	}
}

// A parked message holds the later messages of its aggregate for this
// consumer: they are parked behind it (held_behind), while other
// aggregates flow. Replayed together after the fix, they are applied in
// order.
func TestPartitionedConsumerParksTheRestOfAnAggregateBehindItsFirst(t *testing.T) {
	t.Parallel()
	b := setupConsumer(t)
	b.start(partitionedConfig(), b.amqpURL, nil)
	aggregate, other := uuid.New(), uuid.New()
	first := b.partitioned(aggregate)
	b.handler.set(func(h *effectHandler) { h.permanent = map[string]bool{first.MessageId: true} })
	b.publish(first)
	b.waitInbox(first.MessageId, inbox.StatusPermanentFailed)
	ids := []string{first.MessageId}
	for range 2 {
		msg := b.partitioned(aggregate)
		ids = append(ids, msg.MessageId)
		b.publish(msg)
	}
	flows := b.partitioned(other)
	b.publish(flows)
	b.waitInbox(flows.MessageId, inbox.StatusProcessed)
	for _, id := range ids[1:] {
		if row := b.waitInbox(id, inbox.StatusPermanentFailed); row.LastErrorCode != "held_behind" {
			t.Fatalf("later message %s: %+v, want parked held_behind", id, row)
		}
	}
	var parked []inboxadmin.Parked
	testenv.WaitFor(t, 10*time.Second, "the three in the parking lot", func() bool {
		var err error
		parked, err = inboxadmin.Browse(b.ctx, b.amqpURL, testConsumer, 0)
		return err == nil && len(parked) == len(ids)
	})
	for i, p := range parked {
		if p.MessageID != ids[i] {
			t.Fatalf("parking lot holds %s at %d, want %s", p.MessageID, i, ids[i])
		}
		if i > 0 && (p.ReasonCode != "held_behind" || !strings.Contains(p.Reason, first.MessageId)) {
			t.Fatalf("parked %s: %s %s", p.MessageID, p.ReasonCode, p.Reason)
		}
	}
	if got := b.appliedOrder(ids); len(got) != 0 {
		t.Fatalf("applied %v while the first was parked", got)
	}

	// The cause is fixed; the whole parking lot goes back, in order.
	b.handler.set(func(h *effectHandler) { h.permanent = nil })
	if moved, err := inboxadmin.Replay(b.ctx, b.amqpURL, testConsumer, inboxadmin.ReplayRequest{}); err != nil || len(moved) != len(ids) {
		t.Fatalf("replayed %v, %v", moved, err)
	}
	for _, id := range ids {
		b.waitInbox(id, inbox.StatusProcessed)
	}
	if got := b.appliedOrder(ids); !slices.Equal(got, ids) {
		t.Fatalf("applied %v after the replay, want %v", got, ids)
	}
}

// Each partition has a single active consumer: of two replicas, one at a
// time consumes it. When the active one stops, the other takes over, and
// the aggregate's messages are still applied once each, in order.
func TestPartitionedReplicasTakeOverInOrder(t *testing.T) {
	t.Parallel()
	b := setupConsumer(t)
	var (
		mu      sync.Mutex
		byProc  = map[string][]string{} // replica -> message ids it applied
		release = make(chan struct{})
	)
	replica := func(name string) *inbox.Consumer {
		return testerConsumer(func(ctx context.Context, tx pgx.Tx, d *inbox.Delivery) (inbox.Outcome, error) {
			if name == "first" {
				select { // the first replica is slow: the test stops it mid-stream
				case <-release:
				case <-time.After(50 * time.Millisecond):
				}
			}
			if _, err := tx.Exec(ctx, "INSERT INTO test_effect (message_id) VALUES ($1)", d.MessageID); err != nil {
				return inbox.Outcome{}, err
			}
			mu.Lock()
			byProc[name] = append(byProc[name], d.MessageID)
			mu.Unlock()
			return inbox.Applied(), nil
		})
	}
	cfg := partitionedConfig()
	cfg.BatchSize = 1
	first := b.start(cfg, b.amqpURL, nil, replica("first"))
	b.start(cfg, b.amqpURL, nil, replica("second"))
	aggregate := uuid.New()
	var ids []string
	for range 30 {
		msg := b.partitioned(aggregate)
		ids = append(ids, msg.MessageId)
		b.publish(msg)
	}
	testenv.WaitFor(t, 15*time.Second, "the first replica to apply some", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(byProc["first"]) >= 5
	})
	first.stop() // the active consumer of the partition goes away
	close(release)
	for _, id := range ids {
		b.waitInbox(id, inbox.StatusProcessed)
	}
	if got := b.appliedOrder(ids); !slices.Equal(got, ids) {
		t.Fatalf("applied %v, want %v", got, ids)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(byProc["second"]) == 0 || len(byProc["first"])+len(byProc["second"]) != len(ids) {
		t.Fatalf("first applied %d, second %d, of %d: want the second to take over, each once", len(byProc["first"]), len(byProc["second"]), len(ids))
	}
}

// A message retried in place when the connection drops is left to the
// broker: the retry ends with the session that received the delivery, the
// consumer reconnects and is ready again, and every partition flows. (A
// retry that outlived its session kept the worker, and with it the whole
// session, from ever ending: the consumer never reconnected.)
func TestPartitionedRetryInPlaceEndsWithItsSession(t *testing.T) {
	t.Parallel()
	b := setupConsumer(t)
	proxy := testenv.NewProxy(t, testenv.HostPort(b.amqpURL))
	cfg := partitionedConfig()
	cfg.MaxAttempts = 1000 // it retries in place until the cut
	rc := b.start(cfg, proxy.Rewrite(b.amqpURL), nil)
	stuck := b.partitioned(uuid.New())
	b.handler.set(func(h *effectHandler) { h.failures[stuck.MessageId] = -1 })
	b.publish(stuck)
	testenv.WaitFor(t, 10*time.Second, "a few attempts in place", func() bool { return b.handler.calls.Load() >= 3 })

	proxy.Cut()
	testenv.WaitFor(t, 10*time.Second, "the consumer to see the cut", func() bool { return rc.Ready(b.ctx) != nil })
	proxy.Restore()
	testenv.WaitFor(t, 20*time.Second, "the consumer to be ready again", func() bool { return rc.Ready(b.ctx) == nil })
	b.handler.set(func(h *effectHandler) { delete(h.failures, stuck.MessageId) }) // the downstream is back

	others := make([]amqp.Publishing, 2*testPartitions) // some land in the stuck one's partition, some elsewhere
	for i := range others {
		others[i] = b.partitioned(uuid.New())
		b.publish(others[i])
	}
	for _, msg := range append(others, stuck) {
		b.waitInbox(msg.MessageId, inbox.StatusProcessed)
		if n := b.effects(msg.MessageId); n != 1 {
			t.Fatalf("message %s applied %d times", msg.MessageId, n)
		}
	}
}

// A message that failed and then left its queue unprocessed without being
// parked by the consumer (the broker dead-letters it at the delivery
// limit, its row still RETRYABLE_FAILED) holds the later messages of its
// aggregate too: they are parked behind it, while other aggregates flow.
func TestPartitionedConsumerHoldsBehindAFailedMessageTheBrokerDeadLettered(t *testing.T) {
	t.Parallel()
	b := setupConsumer(t)
	b.start(partitionedConfig(), b.amqpURL, nil)
	aggregate, other := uuid.New(), uuid.New()
	// The earlier message failed, and the broker took it away: its row
	// stays as its last attempt left it.
	gone := b.partitioned(aggregate)
	failed := inbox.Entry{Consumer: testConsumer, MessageID: gone.MessageId, Type: gone.Type, Version: 1,
		AggregateID: aggregate.String(), PayloadHash: "x"}
	if _, err := inbox.RecordFailure(b.ctx, b.pool, failed, inbox.Failure{Status: inbox.StatusRetryableFailed, Code: "test_transient"}); err != nil {
		t.Fatal(err)
	}
	later, flows := b.partitioned(aggregate), b.partitioned(other)
	b.publish(later)
	b.publish(flows)
	b.waitInbox(flows.MessageId, inbox.StatusProcessed)
	if row := b.waitInbox(later.MessageId, inbox.StatusPermanentFailed); row.LastErrorCode != "held_behind" {
		t.Fatalf("later message: %+v, want parked held_behind", row)
	}
	if got := b.appliedOrder([]string{later.MessageId}); len(got) != 0 {
		t.Fatalf("applied %v behind a failed earlier message", got)
	}
}

// A message whose deliveries keep ending without an ack and without a
// failure on record (the handler cut off by a lost connection, a crash, a
// consumer timeout) is dead-lettered by the broker at its delivery limit:
// each such return counts toward x-delivery-limit. The later messages of
// its aggregate must then wait behind it, parked, as behind one the
// consumer parked itself; they must not overtake it.
func TestPartitionedConsumerHoldsBehindAMessageTheBrokerDeadLetteredWithoutAFailure(t *testing.T) {
	t.Parallel()
	b := setupConsumer(t)
	proxy := testenv.NewProxy(t, testenv.HostPort(b.amqpURL))
	cfg := partitionedConfig()
	cfg.DeliveryLimit = 2
	hold := make(chan struct{})
	b.handler.set(func(h *effectHandler) { h.hold = hold }) // every handler waits until the cut
	rc := b.start(cfg, proxy.Rewrite(b.amqpURL), nil)
	aggregate := uuid.New()
	cutOff := b.partitioned(aggregate)
	b.publish(cutOff)
	for deliveries := int64(1); deliveries <= int64(cfg.DeliveryLimit)+1; deliveries++ {
		testenv.WaitFor(t, 20*time.Second, "the message in its handler", func() bool { return b.handler.calls.Load() >= deliveries })
		proxy.Cut()
		testenv.WaitFor(t, 10*time.Second, "the consumer to see the cut", func() bool { return rc.Ready(b.ctx) != nil })
		proxy.Restore()
		testenv.WaitFor(t, 20*time.Second, "the consumer to be ready again", func() bool { return rc.Ready(b.ctx) == nil })
	}
	if parked := b.parked(1); parked[0].MessageId != cutOff.MessageId {
		t.Fatalf("parked %s, want the cut-off message, dead-lettered by the broker", parked[0].MessageId)
	}
	b.handler.set(func(h *effectHandler) { h.hold = nil })
	close(hold)

	later, flows := b.partitioned(aggregate), b.partitioned(uuid.New())
	b.publish(later)
	b.publish(flows)
	b.waitInbox(flows.MessageId, inbox.StatusProcessed)
	if row := b.waitInbox(later.MessageId, inbox.StatusPermanentFailed); row.LastErrorCode != "held_behind" {
		t.Fatalf("later message: %+v, want parked held_behind", row)
	}
	if n := b.effects(later.MessageId); n != 0 {
		t.Fatalf("the later message was applied %d times, ahead of the earlier one", n)
	}
}
