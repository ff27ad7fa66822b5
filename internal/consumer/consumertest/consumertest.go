// Package consumertest runs consumers in a test, against the real PostgreSQL
// and RabbitMQ, on a database and a vhost of the test's own: the kit for a
// consumer's tests (docs/extending.md).
//
//	h := consumertest.Start(t, shipping.New())
//	id := h.Deliver(domain.OrderFulfilledV1{ID: orderID})
//	row := h.WaitDone(shipping.Name, id) // PROCESSED, or parked
//	h.Redeliver(id)                     // the same message again: a duplicate
//
// The consumers run with order-consumer's inbox settings (consumer.Inbox),
// so every body is held to the schema of its type and version.
package consumertest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/yourorg/orders/internal/consumer"
	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/domain"
	"github.com/yourorg/orders/internal/messaging"
	"github.com/yourorg/orders/internal/messaging/inbox"
	"github.com/yourorg/orders/internal/messaging/inbox/inboxadmin"
	"github.com/yourorg/orders/internal/testenv"
	"github.com/yourorg/orders/migrations"
)

// Harness is a running set of consumers and what a test needs around them.
type Harness struct {
	T       testing.TB
	Ctx     context.Context
	Pool    *pgxpool.Pool // the test's own connections to its database
	AMQPURL string
	DBURL   string           // the test's database, as order-consumer connects to it (its role, orders_consumer)
	Metrics *testenv.Metrics // the consumers' metrics

	mu   sync.Mutex
	sent map[string]amqp.Publishing // by message id, for Redeliver
}

// Config is the consumers' configuration in tests: what order-consumer
// gives them (consumer.Inbox: the exchange, the follow-up writer, the
// schema check), with quick retries and a short processing lease.
func Config() inbox.Config {
	return consumer.Inbox(inbox.Config{
		Prefetch: 8, Workers: 4, MaxAttempts: 3,
		RetryDelays:     []time.Duration{50 * time.Millisecond, 100 * time.Millisecond},
		DeliveryLimit:   5,
		ProcessingLease: 2 * time.Second, ShutdownTimeout: 2 * time.Second,
	})
}

// Start runs consumers on a fresh database and vhost until the test ends,
// and returns when they are consuming. With no consumers it only makes the
// database and the vhost, for a test that starts its own with Run.
func Start(t testing.TB, consumers ...*inbox.Consumer) *Harness {
	t.Helper()
	db := testenv.NewDatabase(t, migrations.Schemas...)
	// The consumers run as order-consumer's role: a table of theirs without
	// its grant (migrations/00008_roles.sql) fails their tests.
	h := &Harness{T: t, Ctx: t.Context(), Pool: db.Pool, AMQPURL: testenv.NewVhost(t), DBURL: db.URLAs(migrations.RoleConsumer),
		Metrics: testenv.NewMetrics(), sent: map[string]amqp.Publishing{}}
	if len(consumers) > 0 {
		h.Run(Config(), h.DBURL, h.Metrics, consumers...)
	}
	return h
}

// Run starts another set of consumers on the harness's vhost, as another
// process would: with cfg, a pool of its own on dbURL (the test's
// database, or a proxy in front of it) and metrics. They run until the
// test ends, or until Stop; Run returns when they are consuming.
func (h *Harness) Run(cfg inbox.Config, dbURL string, metrics *testenv.Metrics, consumers ...*inbox.Consumer) *Running {
	h.T.Helper()
	return h.RunOn(cfg, dbURL, h.AMQPURL, metrics, consumers...)
}

// Running is a set of consumers that Run started.
type Running struct {
	*inbox.Consumers
	stop func()
}

// Stop stops the consumers as their process would on SIGTERM, and returns
// once they have: an old build before the new one starts, say. The end of
// the test stops them too.
func (r *Running) Stop() { r.stop() }

// RunOn is Run with the consumers connecting to amqpURL (the harness's
// vhost, or a proxy in front of it).
func (h *Harness) RunOn(cfg inbox.Config, dbURL, amqpURL string, metrics *testenv.Metrics, consumers ...*inbox.Consumer) *Running {
	h.T.Helper()
	pool, err := database.NewPool(h.Ctx, database.PoolConfig{URL: dbURL, AppName: "consumers-under-test"})
	if err != nil {
		h.T.Fatal(err)
	}
	h.T.Cleanup(pool.Close)
	cs, err := inbox.NewConsumers(cfg, messaging.Deps{
		Pool: pool, AMQPURL: amqpURL, Logger: testenv.Logger(), MeterProvider: metrics.Provider,
	}, consumers...)
	if err != nil {
		h.T.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = cs.Run(ctx)
	}()
	var once sync.Once
	stop := func() { once.Do(func() { cancel(); <-done }) }
	h.T.Cleanup(stop)
	testenv.WaitFor(h.T, 15*time.Second, "the consumers to be consuming", func() bool { return cs.Ready(h.Ctx) == nil })
	return &Running{Consumers: cs, stop: stop}
}

// Deliver publishes m to the exchange with the envelope the relay would
// give it, and returns its message id.
func (h *Harness) Deliver(m domain.Message) string {
	h.T.Helper()
	body, err := json.Marshal(m)
	if err != nil {
		h.T.Fatal(err)
	}
	return h.DeliverBody(m.MessageType(), m.MessageVersion(), body)
}

// DeliverBody publishes body as a message of type typ and version, with
// the envelope the relay would give it, and returns its message id: for a
// body no Go type would encode (one that breaks its schema).
func (h *Harness) DeliverBody(typ string, version int, body []byte) string {
	h.T.Helper()
	msg := amqp.Publishing{
		MessageId: uuid.Must(uuid.NewV7()).String(), Type: typ, ContentType: messaging.ContentTypeJSON,
		DeliveryMode: amqp.Persistent, Timestamp: time.Now(), CorrelationId: "test-" + uuid.NewString()[:8], AppId: "inboxtest",
		Headers: amqp.Table{messaging.HeaderMessageVersion: int32(version)}, Body: body,
	}
	h.publish(msg)
	h.mu.Lock()
	h.sent[msg.MessageId] = msg
	h.mu.Unlock()
	return msg.MessageId
}

// Redeliver publishes the message Deliver sent as id once more: a
// duplicate, as a relay that lost a confirm would send it.
func (h *Harness) Redeliver(id string) {
	h.T.Helper()
	h.mu.Lock()
	msg, ok := h.sent[id]
	h.mu.Unlock()
	if !ok {
		h.T.Fatalf("inboxtest: no message %s was delivered", id)
	}
	h.publish(msg)
}

func (h *Harness) publish(msg amqp.Publishing) {
	h.T.Helper()
	conn, err := amqp.Dial(h.AMQPURL)
	if err != nil {
		h.T.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		h.T.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		h.T.Fatal(err)
	}
	dc, err := ch.PublishWithDeferredConfirmWithContext(h.Ctx, domain.EventsExchange, msg.Type, true, false, msg)
	if err != nil || !dc.Wait() {
		h.T.Fatalf("inboxtest: publish %s: %v", msg.Type, err)
	}
}

// WaitDone waits until consumer is done with message id (its inbox row is
// PROCESSED, PERMANENT_FAILED or POISONED) and returns the row.
func (h *Harness) WaitDone(consumer, id string) inboxadmin.Row {
	h.T.Helper()
	var row inboxadmin.Row
	testenv.WaitFor(h.T, 15*time.Second, fmt.Sprintf("%s to be done with %s", consumer, id), func() bool {
		var err error
		row, err = inboxadmin.Get(h.Ctx, h.Pool, consumer, id)
		if err != nil && !errors.Is(err, database.ErrNotFound) {
			h.T.Fatal(err)
		}
		return row.Status == inbox.StatusProcessed || row.Status == inbox.StatusPermanentFailed || row.Status == inbox.StatusPoisoned
	})
	return row
}

// WaitDuplicates waits until the consumers have acknowledged n duplicates
// in all.
func (h *Harness) WaitDuplicates(n int64) {
	h.T.Helper()
	testenv.WaitFor(h.T, 15*time.Second, fmt.Sprintf("%d duplicates", n), func() bool {
		return h.Metrics.Counter(h.T, "consumer.messages.duplicates") >= n
	})
}

// Count runs a SELECT count(*) ... query in the test's database.
func (h *Harness) Count(query string, args ...any) int {
	h.T.Helper()
	var n int
	if err := h.Pool.QueryRow(h.Ctx, query, args...).Scan(&n); err != nil {
		h.T.Fatal(err)
	}
	return n
}
