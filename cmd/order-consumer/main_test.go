package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/yourorg/orders/internal/config"
	"github.com/yourorg/orders/internal/consumer"
	"github.com/yourorg/orders/internal/domain"
	"github.com/yourorg/orders/internal/messaging"
	"github.com/yourorg/orders/internal/messaging/inbox"
	"github.com/yourorg/orders/internal/messaging/inbox/inboxadmin"
	"github.com/yourorg/orders/internal/testenv"
)

// The process migrates, consumes, parks a poison message, reports its
// metrics, stops cleanly, and `replay` moves the parked message back.
func TestConsumerProcessAndReplay(t *testing.T) {
	t.Parallel()
	name := testenv.TestDatabaseName()
	testenv.DropDatabaseAtCleanup(t, name)
	dbURL, amqpURL, admin := testenv.ServerURL(t, name), testenv.NewVhost(t), testenv.FreeAddr(t)
	// Without partitions: the work queue, where a message with no partition
	// header lands and replay puts it back.
	environ := map[string]string{"DATABASE_URL": dbURL, "AMQP_URL": amqpURL, "ADMIN_ADDR": admin, "CONSUMERS": "fulfillment",
		"MESSAGE_PARTITIONS": "0"}

	ctx, cancel := context.WithCancel(t.Context())
	var (
		wg     sync.WaitGroup
		runErr error
	)
	wg.Go(func() { runErr = run(ctx, []string{"-migrate"}, environ, io.Discard, io.Discard) })
	testenv.WaitOK(t, 20*time.Second, "http://"+admin+"/readyz")
	// It runs fulfillment only, and declares every consumer's queues: a
	// message published while the others' processes are down reaches them.
	for _, c := range consumer.All(consumer.Deps{}) {
		queueExists(t, amqpURL, inbox.QueueName(c.Name()))
	}

	// A poison message (its order does not exist) is parked.
	id := uuid.NewString()
	body, _ := json.Marshal(domain.OrderSubmittedV1{ID: uuid.New(), CustomerID: "c-1", Currency: "EUR", TotalCents: 100,
		Items: []domain.ItemLine{{SKU: "A-1", Quantity: 1, UnitPriceCents: 100}}})
	publish(t, amqpURL, amqp.Publishing{MessageId: id, Type: domain.TypeOrderSubmitted, ContentType: "application/json",
		Headers: amqp.Table{messaging.HeaderMessageVersion: int32(1)}, Body: body})
	db, err := pgx.Connect(t.Context(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(t.Context())
	testenv.WaitFor(t, 20*time.Second, "the message to be parked", func() bool {
		row, err := inboxadmin.Get(t.Context(), db, "fulfillment", id)
		return err == nil && row.Status == inbox.StatusPermanentFailed && row.LastErrorCode == "order_not_found"
	})
	var metrics string
	defer func() {
		if t.Failed() {
			t.Logf("metrics:\n%s", metrics)
		}
	}()
	testenv.WaitFor(t, 20*time.Second, "the parked counter", func() bool {
		metrics = get(t, "http://"+admin+"/metrics")
		return strings.Contains(metrics, `consumer_messages_parked_total{consumer_name="fulfillment",reason_code="order_not_found"`)
	})
	for _, want := range []string{"consumer_messages_received_total", "inbox_rows", "inbox_oldest_unprocessed_age_seconds", "consumer_processing_duration_seconds_bucket",
		`table="message_inbox"} `, `db_xmin_horizon_age_seconds{kind="session"`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	cancel()
	wg.Wait()
	if runErr != nil {
		t.Fatal(runErr)
	}

	// replay moves it back to the work queue (where, with no consumer
	// running, it stays).
	if err := run(t.Context(), []string{"replay", "fulfillment", "10"}, environ, io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	if n := depth(t, amqpURL, "orders.fulfillment"); n != 1 {
		t.Fatalf("%d messages in orders.fulfillment after replay", n)
	}
	if n := depth(t, amqpURL, "orders.fulfillment.dlq"); n != 0 {
		t.Fatalf("%d messages left in the parking lot", n)
	}
	if err := run(t.Context(), []string{"replay", "nobody"}, environ, io.Discard, io.Discard); err == nil {
		t.Fatal("replay of an unknown consumer: want an error")
	}
}

func TestBadConfigurationFailsStartup(t *testing.T) {
	t.Parallel()
	err := run(t.Context(), nil, map[string]string{"CONSUMERS": "fulfillment,billing", "CONSUMER_RETRY_DELAYS": "5s,1s", "ORDER_FULFILLED_VERSION": "3"}, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "billing") || !strings.Contains(err.Error(), "CONSUMER_RETRY_DELAYS") || !strings.Contains(err.Error(), "retry delays must grow") ||
		!strings.Contains(err.Error(), "ORDER_FULFILLED_VERSION: order.fulfilled has no version 3 (want one of [1 2])") {
		t.Fatalf("err = %v", err)
	}
}

// Every variable order-consumer reads is documented on the configuration page.
func TestConfigurationPageDocumentsEveryVariable(t *testing.T) {
	t.Parallel()
	testenv.ConfigurationDocuments(t, config.Variables(&Config{}))
}

func publish(t *testing.T, url string, msg amqp.Publishing) {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	dc, err := ch.PublishWithDeferredConfirmWithContext(t.Context(), domain.EventsExchange, msg.Type, true, false, msg)
	if err != nil || !dc.Wait() {
		t.Fatalf("publish: %v", err)
	}
}

func depth(t *testing.T, url, queue string) int {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
	if err != nil {
		t.Fatal(err)
	}
	return q.Messages
}

func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// docker-compose.yml gives order-consumer only variables it reads: a variable it
// does not read is a setting that silently does nothing.
func TestComposeSetsOnlyVariablesItReads(t *testing.T) {
	t.Parallel()
	testenv.ComposeSetsOnly(t, "order-consumer", config.Variables(&Config{}))
}

// `order-consumer declare` declares every consumer's queues and bindings
// and exits: a deployment step before any relay publishes.
func TestDeclareCommand(t *testing.T) {
	t.Parallel()
	amqpURL := testenv.NewVhost(t)
	if err := run(t.Context(), []string{"declare"}, map[string]string{"AMQP_URL": amqpURL}, io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	for _, c := range consumer.All(consumer.Deps{}) {
		for _, q := range (inbox.Topology{Consumer: c.Name(), Partitions: 8}).WorkQueues() { // MESSAGE_PARTITIONS' default
			queueExists(t, amqpURL, q)
		}
		queueExists(t, amqpURL, inbox.ParkingLotName(inbox.QueueName(c.Name())))
	}
}

// queueExists fails the test unless queue exists on amqpURL.
func queueExists(t *testing.T, amqpURL, queue string) {
	t.Helper()
	if _, err := testenv.NewChannel(t, amqpURL).QueueDeclarePassive(queue, true, false, false, false, nil); err != nil {
		t.Fatalf("queue %s: %v", queue, err)
	}
}
