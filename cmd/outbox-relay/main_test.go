package main

import (
	"bytes"
	"context"
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
	"github.com/yourorg/orders/internal/messaging/outbox/outboxadmin"
	"github.com/yourorg/orders/internal/store"
	"github.com/yourorg/orders/internal/testenv"
	"github.com/yourorg/orders/migrations"
)

// The process migrates an empty database, reports ready once connected,
// publishes a committed row, shows it on /metrics, and stops cleanly.
func TestRelayProcess(t *testing.T) {
	t.Parallel()
	name := testenv.TestDatabaseName()
	testenv.DropDatabaseAtCleanup(t, name)
	dbURL, amqpURL, admin := testenv.ServerURL(t, name), testenv.NewVhost(t), testenv.FreeAddr(t)

	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := messaging.DeclareExchange(ch, domain.EventsExchange); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare("observer", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind("observer", "#", domain.EventsExchange, false, nil); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(t.Context())
	var (
		wg     sync.WaitGroup
		runErr error
		logs   bytes.Buffer
		mu     sync.Mutex
	)
	wg.Go(func() {
		runErr = run(ctx, []string{"-migrate"}, map[string]string{
			"DATABASE_URL": dbURL, "AMQP_URL": amqpURL, "ADMIN_ADDR": admin, "RELAY_POLL_INTERVAL": "100ms",
		}, lockedWriter{&mu, &logs}, io.Discard)
	})
	// Until the consumers' queues exist, the relay publishes none of the
	// types they read, and says so.
	var reason string
	testenv.WaitFor(t, 20*time.Second, "/readyz to name the missing reader queues", func() bool {
		resp, err := http.Get("http://" + admin + "/readyz")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		reason = string(body)
		return resp.StatusCode == http.StatusServiceUnavailable && strings.Contains(reason, "orders.warehouse")
	})
	// The consumers' queues at MESSAGE_PARTITIONS' default, the relay's.
	if err := inbox.Declare(t.Context(), amqpURL, consumer.Inbox(inbox.Config{Partitions: 8}), consumer.All(consumer.Deps{})...); err != nil {
		t.Fatal(err)
	}
	testenv.WaitOK(t, 20*time.Second, "http://"+admin+"/readyz")

	db, err := pgx.Connect(t.Context(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(t.Context())
	ids, err := store.OutboxWriter("order-api").Write(t.Context(), db, messaging.Cause{CorrelationID: "c-1"}, domain.OrderCancelledV1{ID: uuid.New()})
	if err != nil {
		t.Fatal(err)
	}
	deliveries, err := ch.Consume("observer", "", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case d := <-deliveries:
		if d.MessageId != ids[0].String() {
			t.Fatalf("got %s", d.MessageId)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("no message")
	}

	// The row is marked (and counted) just after the broker confirmed it.
	var metrics string
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(metrics, `outbox_published_total{message_type="order.cancelled"`) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		metrics = get(t, "http://"+admin+"/metrics")
	}
	for _, want := range []string{`outbox_published_total{message_type="order.cancelled"`, "outbox_pending_oldest_age_seconds",
		"outbox_confirm_latency_seconds_bucket", "relay_broker_connected 1", `table="message_outbox"} `, `db_xmin_horizon_age_seconds{kind="session"`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s:\n%s", want, metrics)
		}
	}
	if !strings.Contains(get(t, "http://"+admin+"/healthz"), "ok") {
		t.Error("healthz")
	}
	cancel()
	wg.Wait()
	if runErr != nil {
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("run: %v\n%s", runErr, logs.String())
	}
}

func TestBadConfigurationFailsStartup(t *testing.T) {
	t.Parallel()
	err := run(t.Context(), nil, map[string]string{"RELAY_LEASE": "1s", "RELAY_CONFIRM_TIMEOUT": "10s", "RELAY_BATCH_SIZE": "x"}, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "RELAY_BATCH_SIZE") {
		t.Fatalf("err = %v", err)
	}
	// Settings that must agree: the error names both variables of each rule.
	for _, tc := range []struct {
		env  map[string]string
		want []string
	}{
		{map[string]string{"RELAY_LEASE": "1s", "RELAY_CONFIRM_TIMEOUT": "10s"}, []string{"RELAY_LEASE", "RELAY_CONFIRM_TIMEOUT"}},
		{map[string]string{"RELAY_MAX_IN_FLIGHT": "10", "RELAY_BATCH_SIZE": "20"}, []string{"RELAY_MAX_IN_FLIGHT", "RELAY_BATCH_SIZE"}},
		{map[string]string{"RELAY_BACKOFF_BASE": "1m", "RELAY_BACKOFF_MAX": "1s"}, []string{"RELAY_BACKOFF_MAX", "RELAY_BACKOFF_BASE"}},
		{map[string]string{"RELAY_RETENTION": "-1h"}, []string{"RELAY_RETENTION"}},
		{map[string]string{"RELAY_MODE": "tail"}, []string{"RELAY_MODE", "poll or wal"}},
		{map[string]string{"RELAY_MODE": "wal", "RELAY_WAL_SLOT": "Bad-Slot"}, []string{"RELAY_WAL_SLOT"}},
	} {
		err := run(t.Context(), nil, tc.env, io.Discard, io.Discard)
		for _, name := range tc.want {
			if err == nil || !strings.Contains(err.Error(), name) {
				t.Errorf("%v: err = %v; want %s named", tc.env, err, name)
			}
		}
	}
}

// Every variable outbox-relay reads is documented on the configuration page.
func TestConfigurationPageDocumentsEveryVariable(t *testing.T) {
	t.Parallel()
	testenv.ConfigurationDocuments(t, config.Variables(&Config{}))
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

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// docker-compose.yml gives outbox-relay only variables it reads: a variable it
// does not read is a setting that silently does nothing.
func TestComposeSetsOnlyVariablesItReads(t *testing.T) {
	t.Parallel()
	testenv.ComposeSetsOnly(t, "outbox-relay", config.Variables(&Config{}))
}

// RELAY_MODE=wal: the process streams the outbox from its slot, its
// replication connection as orders_relay_wal (which migrate makes when
// asked) and the rest as orders_relay, publishes a committed row, and says
// so on /metrics; it stops cleanly.
func TestRelayProcessInWALMode(t *testing.T) {
	t.Parallel()
	db := testenv.LogicalPostgres(t).NewDatabase(t, migrations.Schemas...)
	err := run(t.Context(), []string{"migrate"}, map[string]string{"DATABASE_URL": db.URL, "MIGRATE_RELAY_WAL_ROLE": "true"}, io.Discard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	amqpURL, admin := testenv.NewVhost(t), testenv.FreeAddr(t)
	if err := inbox.Declare(t.Context(), amqpURL, consumer.Inbox(inbox.Config{Partitions: 8}), consumer.All(consumer.Deps{})...); err != nil {
		t.Fatal(err)
	}
	ch := testenv.NewChannel(t, amqpURL)
	if _, err := ch.QueueDeclare("observer", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind("observer", "#", domain.EventsExchange, false, nil); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(t.Context())
	var (
		wg     sync.WaitGroup
		runErr error
		logs   bytes.Buffer
		mu     sync.Mutex
	)
	wg.Go(func() {
		runErr = run(ctx, nil, map[string]string{
			"DATABASE_URL": db.URLAs("orders_relay"), "AMQP_URL": amqpURL, "ADMIN_ADDR": admin,
			"RELAY_MODE": "wal", "RELAY_WAL_SLOT": "process_" + db.Name, "RELAY_POLL_INTERVAL": "100ms",
			"RELAY_WAL_DATABASE_URL": db.URLAs(migrations.RoleRelayWAL),
		}, lockedWriter{&mu, &logs}, io.Discard)
	})
	testenv.WaitOK(t, 20*time.Second, "http://"+admin+"/readyz")
	var streamer string
	testenv.WaitFor(t, 10*time.Second, "the relay's walsender", func() bool {
		_ = db.Pool.QueryRow(t.Context(), "SELECT usename FROM pg_stat_activity WHERE backend_type = 'walsender' AND datname = $1",
			db.Name).Scan(&streamer)
		return streamer != ""
	})
	if streamer != migrations.RoleRelayWAL {
		t.Fatalf("the replication connection is %s's; want %s's", streamer, migrations.RoleRelayWAL)
	}
	order := uuid.New()
	ids, err := store.OutboxWriter("order-api").Write(t.Context(), db.Pool, messaging.Cause{}, domain.OrderCancelledV1{ID: order})
	if err != nil {
		t.Fatal(err)
	}
	deliveries, err := ch.Consume("observer", "", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case d := <-deliveries:
		if d.MessageId != ids[0].String() {
			t.Fatalf("got %s", d.MessageId)
		}
	case <-time.After(15 * time.Second):
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("no message\n%s", logs.String())
	}
	testenv.WaitFor(t, 10*time.Second, "the row to be written back PUBLISHED", func() bool {
		written, _ := outboxadmin.Aggregate(t.Context(), db.Pool, domain.AggregateOrder, order.String())
		return len(written) == 1 && written[0].Status == "PUBLISHED"
	})
	metrics := get(t, "http://"+admin+"/metrics")
	for _, want := range []string{"relay_wal_streaming 1", "relay_wal_slot_lag_bytes", "relay_wal_slot_retained_bytes",
		`outbox_published_total{message_type="order.cancelled"`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	cancel()
	wg.Wait()
	if runErr != nil {
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("run: %v\n%s", runErr, logs.String())
	}
}
