package rabbitadmin_test

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/yourorg/orders/internal/consumer/consumertest"
	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/domain"
	"github.com/yourorg/orders/internal/messaging"
	"github.com/yourorg/orders/internal/messaging/inbox"
	"github.com/yourorg/orders/internal/messaging/inbox/inboxadmin"
	"github.com/yourorg/orders/internal/messaging/outbox"
	"github.com/yourorg/orders/internal/rabbitadmin"
	"github.com/yourorg/orders/internal/store"
	"github.com/yourorg/orders/internal/testenv"
	"github.com/yourorg/orders/migrations"
)

// These tests give each process's user, in a vhost of the test's own, the
// permissions deploy/rabbitmq/definitions.json (or, for the walkthrough,
// definitions.demo.json) gives it in "/", and show
// what it can and cannot do: each test fails when the file loses a
// permission a process needs, or gains one it should not have.

// broker is a test's vhost with the users of the definitions file in it.
type broker struct {
	t     *testing.T
	admin string            // the test's own login: everything
	as    map[string]string // AMQP URL by user of the definitions file
}

func newBroker(t *testing.T, vhostURL string) *broker {
	t.Helper()
	root := testenv.RepoRoot(t)
	d, err := rabbitadmin.ReadDefinitions(filepath.Join(root, rabbitadmin.DefinitionsFile), filepath.Join(root, rabbitadmin.DemoDefinitionsFile))
	if err != nil {
		t.Fatal(err)
	}
	b := &broker{t: t, admin: vhostURL, as: map[string]string{}}
	for _, user := range rabbitadmin.ProcessUsers {
		p, ok := d.PermissionsOf(user, "/")
		if !ok {
			t.Fatalf("%s gives %s no permissions in /", rabbitadmin.DefinitionsFile, user)
		}
		b.as[user] = testenv.NewBrokerUser(t, vhostURL, user, p, d.TopicPermissionsOf(user, "/")...)
	}
	return b
}

// channel opens a channel as user (a connection of its own, closed when
// the test ends).
func (b *broker) channel(user string) *amqp.Channel {
	b.t.Helper()
	url := b.admin
	if user != "" {
		url = b.as[user]
	}
	conn, err := amqp.Dial(url)
	if err != nil {
		b.t.Fatalf("connect as %s: %v", user, err)
	}
	b.t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		b.t.Fatal(err)
	}
	return ch
}

// allowed runs op as user on a fresh channel and fails the test if it fails.
func (b *broker) allowed(user, what string, op func(ch *amqp.Channel) error) {
	b.t.Helper()
	if err := op(b.channel(user)); err != nil {
		b.t.Errorf("%s: %s: %v", user, what, err)
	}
}

// refused runs op as user on a fresh channel and fails the test unless the
// broker refused it with ACCESS_REFUSED (403).
func (b *broker) refused(user, what string, op func(ch *amqp.Channel) error) {
	b.t.Helper()
	err := op(b.channel(user))
	var amqpErr *amqp.Error
	if !errors.As(err, &amqpErr) || amqpErr.Code != amqp.AccessRefused {
		b.t.Errorf("%s: %s: want ACCESS_REFUSED (403), got %v", user, what, err)
	}
}

// publish publishes to exchange with key under a publisher confirm, and
// returns the broker's refusal (a channel closed with its reason), a nack,
// or nil once it is confirmed.
func publish(exchange, key string) func(ch *amqp.Channel) error {
	return func(ch *amqp.Channel) error {
		closed := ch.NotifyClose(make(chan *amqp.Error, 1))
		if err := ch.Confirm(false); err != nil {
			return err
		}
		dc, err := ch.PublishWithDeferredConfirm(exchange, key, false, false, amqp.Publishing{MessageId: uuid.NewString(), Body: []byte("{}")})
		if err != nil {
			return err
		}
		select {
		case <-dc.Done():
			if !dc.Acked() {
				select { // a refusal closes the channel, which nacks what was waiting
				case err := <-closed:
					return err
				case <-time.After(time.Second):
					return errors.New("nacked")
				}
			}
			return nil
		case err := <-closed:
			return err
		case <-time.After(10 * time.Second):
			return errors.New("no confirm in 10s")
		}
	}
}

func declareQueue(name string) func(ch *amqp.Channel) error {
	return func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclare(name, true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
		return err
	}
}

func declarePassive(name string) func(ch *amqp.Channel) error {
	return func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
		return err
	}
}

func consume(queue string) func(ch *amqp.Channel) error {
	return func(ch *amqp.Channel) error {
		_, err := ch.Consume(queue, "", false, false, false, false, nil)
		return err
	}
}

func get(queue string) func(ch *amqp.Channel) error {
	return func(ch *amqp.Channel) error {
		_, _, err := ch.Get(queue, false)
		return err
	}
}

// topology is the queues of one consumer, as order-consumer declares them.
var topology = inbox.Topology{
	Exchange: domain.EventsExchange,
	Consumer: "fulfillment", Types: []string{domain.TypeOrderSubmitted},
	RetryDelays: []time.Duration{time.Second, 1500 * time.Millisecond, 2 * time.Minute}, DeliveryLimit: 20,
}

// declareTopology declares the exchange and the fulfillment consumer's
// queues with the test's own login, plus a queue outside orders.*.
func (b *broker) declareTopology() {
	b.t.Helper()
	ch := b.channel("")
	if err := topology.Declare(ch); err != nil {
		b.t.Fatal(err)
	}
	if err := declareQueue("billing.work")(ch); err != nil {
		b.t.Fatal(err)
	}
}

var (
	workQueue  = inbox.QueueName(topology.Consumer)
	parkingLot = inbox.ParkingLotName(workQueue)
	retryQueue = topology.RetryQueue(1500 * time.Millisecond) // a delay with a dot in its name
)

func TestRelayUser(t *testing.T) {
	t.Parallel()
	b := newBroker(t, testenv.NewVhost(t))
	const relay = rabbitadmin.RelayUser
	b.allowed(relay, "declare orders.events", declareExchange)
	b.allowed(relay, "publish to orders.events", publish(domain.EventsExchange, domain.TypeOrderSubmitted))
	b.declareTopology()
	partitioned := topology
	partitioned.Consumer, partitioned.Partitions = "shipping", 4
	b.allowed("", "declare a partitioned topology", partitioned.Declare)
	bindReaders := func(t inbox.Topology) func(ch *amqp.Channel) error {
		return func(ch *amqp.Channel) error {
			for typ, readers := range t.Readers() {
				for _, r := range readers {
					if err := r.Bind(ch, typ); err != nil {
						return err
					}
				}
			}
			return nil
		}
	}
	b.allowed(relay, "bind the readers' queues for their types (outbox.Config.Readers)", bindReaders(topology))
	b.allowed(relay, "bind the readers' partition queues and partition exchanges", bindReaders(partitioned))
	b.refused(relay, "declare a queue", declareQueue("orders.shipping"))
	b.refused(relay, "consume a work queue", consume(workQueue))
	b.refused(relay, "get from a parking lot", get(parkingLot))
	b.refused(relay, "publish to the default exchange (amq.default)", publish("", workQueue))
	b.refused(relay, "bind a queue", func(ch *amqp.Channel) error {
		return ch.QueueBind(workQueue, "#", domain.EventsExchange, false, nil)
	})
	b.refused(relay, "bind a queue by a pattern of types", func(ch *amqp.Channel) error {
		return ch.QueueBind(workQueue, "order.*", domain.EventsExchange, false, nil)
	})
	b.refused(relay, "bind a parking lot", func(ch *amqp.Channel) error {
		return ch.QueueBind(parkingLot, domain.TypeOrderSubmitted, domain.EventsExchange, false, nil)
	})
	b.refused(relay, "bind a retry queue", func(ch *amqp.Channel) error {
		return ch.QueueBind(retryQueue, domain.TypeOrderSubmitted, domain.EventsExchange, false, nil)
	})
	b.refused(relay, "bind a queue outside orders.*", func(ch *amqp.Channel) error {
		return ch.QueueBind("billing.work", domain.TypeOrderSubmitted, domain.EventsExchange, false, nil)
	})
}

func TestConsumerUser(t *testing.T) {
	t.Parallel()
	b := newBroker(t, testenv.NewVhost(t))
	const consumer = rabbitadmin.ConsumerUser
	b.allowed(consumer, "declare its topology (exchange, work, retry and parking-lot queues, bindings)", topology.Declare)
	partitioned := topology
	partitioned.Partitions = 4
	b.allowed(consumer, "declare its partitioned topology (partition exchange, partition queues, bindings)", partitioned.Declare)
	b.allowed(consumer, "consume a partition queue", consume(partitioned.WorkQueues()[3]))
	b.allowed(consumer, "consume its work queue", consume(workQueue))
	b.allowed(consumer, "retry: publish to a retry queue through amq.default", publish("", retryQueue))
	b.allowed(consumer, "park: publish to its parking lot through amq.default", publish("", parkingLot))
	b.declareTopology()
	b.refused(consumer, "publish to orders.events", publish(domain.EventsExchange, domain.TypeOrderSubmitted))
	b.refused(consumer, "declare a queue outside orders.*", declareQueue("billing.work"))
	b.refused(consumer, "consume a queue outside orders.*", consume("billing.work"))
	b.refused(consumer, "consume a parking lot (orderctl's)", consume(parkingLot))
	b.refused(consumer, "bind a queue outside orders.*", func(ch *amqp.Channel) error {
		return ch.QueueBind("billing.work", "#", domain.EventsExchange, false, nil)
	})
}

func TestOperatorUser(t *testing.T) {
	t.Parallel()
	b := newBroker(t, testenv.NewVhost(t))
	b.declareTopology()
	const operator = rabbitadmin.OperatorUser
	url := b.as[operator]
	ctx := t.Context()

	// orderctl status: a passive declare of every queue.
	for _, q := range []string{workQueue, retryQueue, parkingLot} {
		b.allowed(operator, "passive declare of "+q, declarePassive(q))
	}
	// orderctl parked list|show|replay|discard.
	kept, dropped := b.park(), b.park()
	testenv.WaitFor(t, 10*time.Second, "the two parked messages in the parking lot", func() bool { return b.depth(parkingLot) == 2 })
	parked, err := inboxadmin.Browse(ctx, url, topology.Consumer, 0)
	if err != nil || len(parked) != 2 {
		t.Fatalf("browse as %s: %v, %d messages", operator, err, len(parked))
	}
	// Browse and Discard give back what they looked at with a nack, which
	// the broker applies a moment later; each next step waits for it.
	testenv.WaitFor(t, 10*time.Second, "the browsed messages back", func() bool { return b.depth(parkingLot) == 2 })
	if _, err := inboxadmin.Discard(ctx, url, topology.Consumer, dropped, func(inboxadmin.Parked) error { return nil }); err != nil {
		t.Errorf("discard as %s: %v", operator, err)
	}
	testenv.WaitFor(t, 10*time.Second, "the kept message back", func() bool { return b.depth(parkingLot) == 1 })
	moved, err := inboxadmin.Replay(ctx, url, topology.Consumer, inboxadmin.ReplayRequest{})
	if err != nil || len(moved) != 1 || moved[0] != kept {
		t.Errorf("replay as %s: moved %v, %v; want [%s]", operator, moved, err, kept)
	}
	if got := b.depth(workQueue); got != 1 {
		t.Errorf("%s holds %d messages after the replay, want 1", workQueue, got)
	}

	b.refused(operator, "declare a queue", declareQueue("orders.shipping"))
	b.refused(operator, "declare orders.events", declareExchange)
	b.refused(operator, "consume a work queue", consume(workQueue))
	b.refused(operator, "get from a work queue", get(workQueue))
	b.refused(operator, "publish to orders.events", publish(domain.EventsExchange, domain.TypeOrderSubmitted))
}

func TestWalkthroughUser(t *testing.T) {
	t.Parallel()
	b := newBroker(t, testenv.NewVhost(t))
	b.declareTopology()
	const walkthrough = rabbitadmin.WalkthroughUser
	// The walkthrough waits for the consumers' queues, publishes a
	// duplicate and a poison message, and peeks into a parking lot.
	b.allowed(walkthrough, "passive declare of a work queue", declarePassive(workQueue))
	b.allowed(walkthrough, "publish to orders.events", publish(domain.EventsExchange, domain.TypeOrderSubmitted))
	b.park()
	b.allowed(walkthrough, "get from a parking lot", get(parkingLot))

	b.refused(walkthrough, "declare a queue", declareQueue("orders.shipping"))
	b.refused(walkthrough, "consume a work queue", consume(workQueue))
	b.refused(walkthrough, "publish to the default exchange (amq.default)", publish("", workQueue))
}

// park puts a message in the parking lot with the test's own login, and
// returns its id.
func (b *broker) park() string {
	b.t.Helper()
	ch := b.channel("")
	id := uuid.NewString()
	if err := ch.PublishWithContext(b.t.Context(), "", parkingLot, true, false, amqp.Publishing{MessageId: id, Type: domain.TypeOrderSubmitted, Body: []byte("{}")}); err != nil {
		b.t.Fatal(err)
	}
	testenv.WaitFor(b.t, 10*time.Second, "the parked message", func() bool { return b.depth(parkingLot) > 0 })
	return id
}

func (b *broker) depth(queue string) int {
	b.t.Helper()
	q, err := b.channel("").QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		b.t.Fatal(err)
	}
	return q.Messages
}

// TestProcessesRunAsTheirUsers runs the real relay and consumers, each
// logged in as its own user, through a message that is published,
// retried, parked, and replayed by the operator: any permission missing on
// that path stops the message, and the test.
func TestProcessesRunAsTheirUsers(t *testing.T) {
	t.Parallel()
	h := consumertest.Start(t) // a database and a vhost
	b := newBroker(t, h.AMQPURL)
	ctx := t.Context()

	// A consumer that fails the first attempt of every message, transiently
	// (a trip through a retry queue) for one order, and for good (the
	// parking lot) for the other.
	retried, parked := uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())
	var mu sync.Mutex
	failed := map[uuid.UUID]bool{}
	c := inbox.NewConsumer("permissions")
	inbox.Handle(c, func(_ context.Context, _ pgx.Tx, _ *inbox.Delivery, m domain.OrderCancelledV1) (inbox.Outcome, error) {
		mu.Lock()
		defer mu.Unlock()
		if failed[m.ID] {
			return inbox.Applied(), nil
		}
		failed[m.ID] = true
		if m.ID == parked {
			return inbox.Outcome{}, inbox.Permanent("test_permanent", errors.New("parked on purpose"))
		}
		return inbox.Outcome{}, inbox.Retryable("test_transient", errors.New("retried on purpose"))
	})
	pool, err := database.NewPool(ctx, database.PoolConfig{URL: h.DBURL, AppName: "consumer-as-its-user"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	consumers, err := inbox.NewConsumers(consumertest.Config(), messaging.Deps{
		Pool: pool, AMQPURL: b.as[rabbitadmin.ConsumerUser], Logger: testenv.Logger(), MeterProvider: testenv.NewMetrics().Provider,
	}, c)
	if err != nil {
		t.Fatal(err)
	}
	run(t, "the consumers", consumers.Run)
	testenv.WaitFor(t, 15*time.Second, "the consumer to be consuming as "+rabbitadmin.ConsumerUser, func() bool { return consumers.Ready(ctx) == nil })

	// The relay connects as its own PostgreSQL role, as outbox-relay does.
	relayPool, err := database.NewPool(ctx, database.PoolConfig{URL: testenv.AsRole(h.DBURL, migrations.RoleRelay), AppName: "relay-as-its-user"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(relayPool.Close)
	relay, err := outbox.NewRelay(outbox.Config{
		BatchSize: 10, MaxInFlight: 10, PollInterval: 100 * time.Millisecond, Lease: 5 * time.Second,
		ConfirmTimeout: 2 * time.Second, MaxAttempts: 5, BackoffBase: 10 * time.Millisecond,
		BackoffMax: 100 * time.Millisecond, ShutdownTimeout: 2 * time.Second,
		// The relay binds the consumer's queue before it publishes (as
		// outbox-relay does the order service's consumers).
		Readers: inbox.Topology{Consumer: c.Name(), Exchange: domain.EventsExchange, Types: c.Types(), Partitions: consumertest.Config().Partitions}.Readers(),
	}, messaging.Deps{Pool: relayPool, AMQPURL: b.as[rabbitadmin.RelayUser], Logger: testenv.Logger(), MeterProvider: testenv.NewMetrics().Provider})
	if err != nil {
		t.Fatal(err)
	}
	run(t, "the relay", relay.Run)

	var ids []uuid.UUID
	if err := pgx.BeginFunc(ctx, h.Pool, func(tx pgx.Tx) error {
		ids, err = store.OutboxWriter("order-api").Write(ctx, tx, messaging.Cause{},
			domain.OrderCancelledV1{ID: retried}, domain.OrderCancelledV1{ID: parked})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	retriedID, parkedID := ids[0].String(), ids[1].String()

	if row := h.WaitDone(c.Name(), retriedID); row.Status != inbox.StatusProcessed || row.Attempts != 2 {
		t.Errorf("the retried message: %s after %d attempts, want PROCESSED after 2 (relay publish, retry queue, redelivery)", row.Status, row.Attempts)
	}
	if row := h.WaitDone(c.Name(), parkedID); row.Status != inbox.StatusPermanentFailed {
		t.Fatalf("the parked message: %s, want %s", row.Status, inbox.StatusPermanentFailed)
	}
	operator := b.as[rabbitadmin.OperatorUser]
	testenv.WaitFor(t, 10*time.Second, "the message in the parking lot", func() bool {
		msgs, err := inboxadmin.Browse(ctx, operator, c.Name(), 0)
		return err == nil && len(msgs) == 1 && msgs[0].MessageID == parkedID
	})
	// Browse returns once the message is back in the parking lot.
	lot := inbox.ParkingLotName(inbox.QueueName(c.Name()))
	if n := b.depth(lot); n != 1 {
		t.Fatalf("right after browsing, the parking lot holds %d messages, want 1", n)
	}
	if moved, err := inboxadmin.Replay(ctx, operator, c.Name(), inboxadmin.ReplayRequest{MessageID: parkedID}); err != nil || len(moved) != 1 {
		t.Fatalf("replay as %s: %v (moved %v)", rabbitadmin.OperatorUser, err, moved)
	}
	testenv.WaitFor(t, 15*time.Second, "the replayed message to be processed", func() bool {
		row, err := inboxadmin.Get(ctx, h.Pool, c.Name(), parkedID)
		return err == nil && row.Status == inbox.StatusProcessed
	})
}

// run runs fn until the test ends.
func run(t *testing.T, what string, fn func(context.Context) error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- fn(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("%s: %v", what, err)
		}
	})
}

// declareExchange declares the order service's exchange, as the relay and
// the consumers do.
func declareExchange(ch *amqp.Channel) error {
	return messaging.DeclareExchange(ch, domain.EventsExchange)
}
