package consumer_test

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
	"go.uber.org/goleak"

	"github.com/yourorg/orders/internal/auth"
	"github.com/yourorg/orders/internal/consumer"
	"github.com/yourorg/orders/internal/consumer/consumertest"
	"github.com/yourorg/orders/internal/consumer/fulfillment"
	"github.com/yourorg/orders/internal/consumer/notification"
	"github.com/yourorg/orders/internal/consumer/warehouse"
	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/domain"
	"github.com/yourorg/orders/internal/httpapi"
	"github.com/yourorg/orders/internal/messaging"
	"github.com/yourorg/orders/internal/messaging/inbox"
	"github.com/yourorg/orders/internal/messaging/inbox/inboxadmin"
	"github.com/yourorg/orders/internal/messaging/outbox"
	"github.com/yourorg/orders/internal/store"
	"github.com/yourorg/orders/internal/telemetry"
	"github.com/yourorg/orders/internal/testenv"
	"github.com/yourorg/orders/migrations"
)

// TestMain fails the package when its tests leave goroutines running,
// toxiproxy's and pgx's aside (testenv.VerifyNoLeaks), and the webhook
// clients' idle connections.
func TestMain(m *testing.M) {
	testenv.VerifyNoLeaks(m,
		goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
	)
}

// flow is the order service in one process: the three consumers, and, when
// asked, a relay and the HTTP API, on the test's database and vhost.
type flow struct {
	t       testing.TB
	ctx     context.Context
	pool    *pgxpool.Pool
	dbURL   string
	amqpURL string
	api     *httptest.Server
	tracer  trace.TracerProvider
	proxy   *testenv.Proxy // between the components and RabbitMQ, with options.proxy
}

func testLogger() *slog.Logger {
	if os.Getenv("TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

type options struct {
	relay   bool
	api     bool
	webhook string
	// tracer, when set, traces every component (the API, the relay, the
	// consumers, their database queries and webhook calls).
	tracer trace.TracerProvider
	// proxy puts a proxy between the relay and the consumers and RabbitMQ,
	// so that a test can cut their connections (flow.proxy).
	proxy bool
	// fulfilledVersion is the version of order.fulfilled fulfillment
	// writes (ORDER_FULFILLED_VERSION); 0: the default.
	fulfilledVersion int
	// logs, when set, receives the log lines of every component, JSON.
	logs io.Writer
}

// logger is the components' logger: JSON lines into o.logs when set.
func (o options) logger() *slog.Logger {
	if o.logs != nil {
		return slog.New(slog.NewJSONHandler(o.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return testLogger()
}

func setup(t testing.TB, o options) *flow {
	t.Helper()
	db := testenv.NewDatabase(t, migrations.Schemas...)
	f := &flow{t: t, ctx: t.Context(), pool: db.Pool, dbURL: db.URL, amqpURL: testenv.NewVhost(t), tracer: o.tracer}
	brokerURL := f.amqpURL
	if o.proxy {
		f.proxy = testenv.NewProxy(t, testenv.HostPort(f.amqpURL))
		brokerURL = f.proxy.Rewrite(f.amqpURL)
	}
	f.run(migrations.RoleConsumer, func(ctx context.Context, pool *pgxpool.Pool) (func(context.Context) error, func(context.Context) error) {
		all := consumer.All(consumer.Deps{
			Notifier:              notification.Config{URL: o.webhook, Timeout: time.Second, TracerProvider: f.tracerProvider()},
			MeterProvider:         metricnoop.NewMeterProvider(),
			OrderFulfilledVersion: o.fulfilledVersion,
		})
		cs, err := inbox.NewConsumers(consumer.Inbox(inbox.Config{
			Prefetch: 16, Workers: 4, MaxAttempts: 4,
			RetryDelays:     []time.Duration{50 * time.Millisecond, 100 * time.Millisecond},
			ProcessingLease: 2 * time.Second, ShutdownTimeout: 2 * time.Second,
		}), messaging.Deps{Pool: pool, AMQPURL: brokerURL, Logger: o.logger(), MeterProvider: metricnoop.NewMeterProvider(), TracerProvider: f.tracerProvider()},
			all...)
		if err != nil {
			t.Fatal(err)
		}
		return cs.Run, cs.Ready
	})
	if o.relay {
		f.run(migrations.RoleRelay, func(ctx context.Context, pool *pgxpool.Pool) (func(context.Context) error, func(context.Context) error) {
			r, err := outbox.NewRelay(outbox.Config{PollInterval: 50 * time.Millisecond, BackoffBase: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond},
				messaging.Deps{Pool: pool, AMQPURL: brokerURL, Logger: testLogger(), MeterProvider: metricnoop.NewMeterProvider(), TracerProvider: f.tracerProvider()})
			if err != nil {
				t.Fatal(err)
			}
			return r.Run, r.Ready
		})
	}
	if o.api {
		apiPool, err := database.NewPool(f.ctx, database.PoolConfig{URL: testenv.AsRole(f.dbURL, migrations.RoleAPI), Tracer: f.dbTracer()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(apiPool.Close)
		secret := []byte(rand.Text() + rand.Text())
		verifier, err := auth.NewVerifier(auth.Options{Secret: secret})
		if err != nil {
			t.Fatal(err)
		}
		operator, err := auth.Mint(secret, auth.Principal{Subject: "consumer-test", Role: auth.RoleOperator}, time.Hour, "", "")
		if err != nil {
			t.Fatal(err)
		}
		handler, err := httpapi.New(httpapi.Config{IdempotencyKeyTTL: time.Hour}, httpapi.Deps{
			Verifier: verifier, Pool: apiPool, Logger: o.logger(), TracerProvider: f.tracerProvider(),
			MeterProvider: metricnoop.NewMeterProvider(), MetricsHandler: http.NotFoundHandler(),
		})
		if err != nil {
			t.Fatal(err)
		}
		// These tests' requests are an operator's: the API's own rules
		// are tested in internal/httpapi.
		f.api = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			r.Header.Set("Authorization", "Bearer "+operator)
			handler.ServeHTTP(w, r)
		}))
		t.Cleanup(f.api.Close)
	}
	return f
}

func (f *flow) tracerProvider() trace.TracerProvider {
	if f.tracer == nil {
		return tracenoop.NewTracerProvider()
	}
	return f.tracer
}

func (f *flow) dbTracer() pgx.QueryTracer {
	if f.tracer == nil {
		return nil
	}
	return telemetry.DBTracer(f.tracer)
}

// run starts a component on a pool of its own, connected as role (its
// process's), waits until it is ready, and stops it when the test ends.
func (f *flow) run(role string, build func(context.Context, *pgxpool.Pool) (run, ready func(context.Context) error)) {
	f.t.Helper()
	// Short timeouts, so that a test can make a statement wait out its lock.
	pool, err := database.NewPool(f.ctx, database.PoolConfig{URL: testenv.AsRole(f.dbURL, role), Tracer: f.dbTracer(), LockTimeout: 300 * time.Millisecond, StatementTimeout: 5 * time.Second})
	if err != nil {
		f.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	run, ready := build(ctx, pool)
	done := make(chan struct{})
	go func() { defer close(done); _ = run(ctx) }()
	f.t.Cleanup(func() { cancel(); <-done; pool.Close() })
	testenv.WaitFor(f.t, 10*time.Second, "a component to be ready", func() bool { return ready(f.ctx) == nil })
}

// createOrder commits an order and its order.submitted row, as the API does.
func (f *flow) createOrder(correlationID string, skus ...string) *domain.Order {
	f.t.Helper()
	if len(skus) == 0 {
		skus = []string{"A-1"}
	}
	var items []domain.Item
	for _, sku := range skus {
		items = append(items, domain.Item{SKU: sku, Quantity: 1, UnitPriceCents: 100})
	}
	o, err := domain.NewOrder(uuid.Must(uuid.NewV7()), "c-1", "EUR", items)
	if err != nil {
		f.t.Fatal(err)
	}
	err = pgx.BeginFunc(f.ctx, f.pool, func(tx pgx.Tx) error {
		created, err := store.CreateOrder(f.ctx, tx, o, domain.Cause{CorrelationID: correlationID})
		if err != nil {
			return err
		}
		_, err = store.OutboxWriter("test").Write(f.ctx, tx, messaging.Cause{CorrelationID: correlationID}, domain.SubmittedMessage(created))
		return err
	})
	if err != nil {
		f.t.Fatal(err)
	}
	return o
}

// send publishes a message as the relay would, with a fresh message id,
// and returns the id.
func (f *flow) send(m domain.Message, correlationID string) string {
	f.t.Helper()
	payload, _ := json.Marshal(m)
	row := outbox.Row{ID: uuid.Must(uuid.NewV7()), Type: m.MessageType(), Version: m.MessageVersion(), Exchange: domain.EventsExchange,
		RoutingKey: m.MessageType(), Payload: payload, Headers: map[string]string{"correlation_id": correlationID}, CreatedAt: time.Now()}
	f.publish(outbox.Publishing(row))
	return row.ID.String()
}

func (f *flow) publish(msg amqp.Publishing) {
	f.t.Helper()
	conn, err := amqp.Dial(f.amqpURL)
	if err != nil {
		f.t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		f.t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		f.t.Fatal(err)
	}
	dc, err := ch.PublishWithDeferredConfirmWithContext(f.ctx, domain.EventsExchange, msg.Type, true, false, msg)
	if err != nil || !dc.Wait() {
		f.t.Fatalf("publish %s: %v", msg.Type, err)
	}
}

func (f *flow) status(id uuid.UUID) domain.Status {
	f.t.Helper()
	o, err := store.GetOrder(f.ctx, f.pool, id)
	if err != nil {
		f.t.Fatal(err)
	}
	return o.Status()
}

func (f *flow) waitStatus(id uuid.UUID, want domain.Status) {
	f.t.Helper()
	testenv.WaitFor(f.t, 20*time.Second, fmt.Sprintf("order %s to be %s", id, want), func() bool { return f.status(id) == want })
}

func (f *flow) inboxRow(consumerName, messageID string) inboxadmin.Row {
	f.t.Helper()
	var row inboxadmin.Row
	testenv.WaitFor(f.t, 20*time.Second, fmt.Sprintf("%s to finish with %s", consumerName, messageID), func() bool {
		var err error
		row, err = inboxadmin.Get(f.ctx, f.pool, consumerName, messageID)
		return err == nil && row.Status != inbox.StatusProcessing && row.Status != inbox.StatusRetryableFailed
	})
	return row
}

func (f *flow) setStatus(id uuid.UUID, s domain.Status) {
	f.t.Helper()
	if _, err := f.pool.Exec(f.ctx, "UPDATE orders SET status = $1 WHERE order_id = $2", s, id); err != nil {
		f.t.Fatal(err)
	}
}

// transitions lists an order's history as "FROM>TO" strings.
func (f *flow) transitions(id uuid.UUID) []string {
	f.t.Helper()
	history, err := store.History(f.ctx, f.pool, id)
	if err != nil {
		f.t.Fatal(err)
	}
	var out []string
	for _, h := range history {
		out = append(out, string(h.From)+">"+string(h.To))
	}
	return out
}

func (f *flow) one(query string, args ...any) string {
	f.t.Helper()
	var s *string
	if err := f.pool.QueryRow(f.ctx, query, args...).Scan(&s); err != nil && !errors.Is(err, pgx.ErrNoRows) {
		f.t.Fatal(err)
	}
	if s == nil {
		return ""
	}
	return *s
}

// An order travels SUBMITTED -> FULFILLMENT_REQUESTED -> FULFILLED through
// three consumers and three relay hops; each step is one transition, each
// follow-up message names its cause, and the correlation id rides along.
func TestOrderTravelsToFulfilled(t *testing.T) {
	t.Parallel()
	f := setup(t, options{relay: true})
	o := f.createOrder("corr-flow", "A-1", "B-2")
	f.waitStatus(o.ID(), domain.StatusFulfilled)
	testenv.WaitFor(t, 10*time.Second, "both notifications", func() bool {
		return f.one("SELECT count(*)::text FROM customer_notification WHERE order_id = $1", o.ID()) == "2"
	})

	if got := strings.Join(f.transitions(o.ID()), " "); got != ">SUBMITTED SUBMITTED>FULFILLMENT_REQUESTED FULFILLMENT_REQUESTED>FULFILLED" {
		t.Fatalf("history %s", got)
	}
	// The causation chain: submitted -> requested -> completed -> fulfilled.
	chain := []string{domain.TypeOrderSubmitted, domain.TypeFulfillmentRequested, domain.TypeFulfillmentCompleted, domain.TypeOrderFulfilled}
	for i := 1; i < len(chain); i++ {
		cause := f.one("SELECT outbox_id::text FROM message_outbox WHERE aggregate_id = $1 AND message_type = $2", o.ID().String(), chain[i-1])
		got := f.one("SELECT headers->>'causation_id' FROM message_outbox WHERE aggregate_id = $1 AND message_type = $2", o.ID().String(), chain[i])
		if cause == "" || got != cause {
			t.Errorf("%s caused by %q, want %q (%s)", chain[i], got, cause, chain[i-1])
		}
		if corr := f.one("SELECT headers->>'correlation_id' FROM message_outbox WHERE aggregate_id = $1 AND message_type = $2", o.ID().String(), chain[i]); corr != "corr-flow" {
			t.Errorf("%s has correlation id %q", chain[i], corr)
		}
	}
	if s := f.one("SELECT status FROM stock_reservation WHERE order_id = $1", o.ID()); s != "RESERVED" {
		t.Errorf("reservation %s", s)
	}
	if kinds := f.one("SELECT string_agg(kind || ':' || status, ',' ORDER BY kind) FROM customer_notification WHERE order_id = $1", o.ID()); kinds != "order_fulfilled:SKIPPED,order_received:SKIPPED" {
		t.Errorf("notifications %s", kinds)
	}
	if n := f.one("SELECT count(*)::text FROM message_inbox WHERE status <> 'PROCESSED'"); n != "0" {
		t.Errorf("%s inbox rows not PROCESSED", n)
	}
}

// The producer switch of order.fulfilled (ORDER_FULFILLED_VERSION), on the
// whole flow: by default fulfillment writes version 1, and the shipment has
// no reservation; switched to 2, it writes version 2 with the warehouse's
// reservation, which the shipment keeps. Either way the order is FULFILLED
// and notified once, and nothing is parked.
func TestOrderFulfilledVersionSwitch(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		setting, want int
	}{{0, 1}, {2, 2}} {
		t.Run(fmt.Sprintf("ORDER_FULFILLED_VERSION=%d", tc.setting), func(t *testing.T) {
			t.Parallel()
			f := setup(t, options{relay: true, fulfilledVersion: tc.setting})
			o := f.createOrder("corr-v", "A-1")
			f.waitStatus(o.ID(), domain.StatusFulfilled)
			testenv.WaitFor(t, 20*time.Second, "the shipment and both notifications", func() bool {
				return f.one("SELECT count(*)::text FROM shipment WHERE order_id = $1", o.ID()) == "1" &&
					f.one("SELECT count(*)::text FROM customer_notification WHERE order_id = $1", o.ID()) == "2"
			})
			if v := f.one("SELECT message_version::text FROM message_outbox WHERE aggregate_id = $1 AND message_type = 'order.fulfilled'", o.ID().String()); v != fmt.Sprint(tc.want) {
				t.Errorf("order.fulfilled written as version %s, want %d", v, tc.want)
			}
			reservation := f.one("SELECT reservation_id::text FROM stock_reservation WHERE order_id = $1", o.ID())
			want := map[bool]string{true: reservation, false: ""}[tc.want == 2]
			if got := f.one("SELECT reservation_id::text FROM shipment WHERE order_id = $1", o.ID()); reservation == "" || got != want {
				t.Errorf("shipment reservation %q, want %q (the warehouse's is %q)", got, want, reservation)
			}
			if n := f.one("SELECT count(*)::text FROM message_inbox WHERE status <> 'PROCESSED'"); n != "0" {
				t.Errorf("%s inbox rows not PROCESSED", n)
			}
		})
	}
}

// Every consumer reads every version the catalogue has of each type it
// reads: while producers may write either version, a consumer that knew
// only one would park the other as unsupported_version. Each example of
// the catalogue goes to every consumer; none is parked for its version or
// its shape (the order of the examples does not exist, so some are parked
// for that, which is the handlers' business).
func TestEveryConsumerReadsEveryVersionOfItsTypes(t *testing.T) {
	t.Parallel()
	all := consumer.All(consumer.Deps{MeterProvider: metricnoop.NewMeterProvider()})
	h := consumertest.Start(t, all...)
	for _, m := range domain.Examples() {
		id := h.Deliver(m)
		for _, c := range all {
			if !slices.Contains(c.Types(), m.MessageType()) {
				continue
			}
			row := h.WaitDone(c.Name(), id)
			if slices.Contains([]string{"unsupported_version", "schema_violation", "malformed_message"}, row.LastErrorCode) {
				t.Errorf("%s parked %s version %d, the catalogue's example: %s", c.Name(), m.MessageType(), m.MessageVersion(), row.LastErrorMessage)
			}
		}
	}
}

// A sku the warehouse never has: the order is REJECTED.
func TestOutOfStockOrderIsRejected(t *testing.T) {
	t.Parallel()
	f := setup(t, options{relay: true})
	o := f.createOrder("corr-oos", "A-1", warehouse.OutOfStockPrefix+"7")
	f.waitStatus(o.ID(), domain.StatusRejected)
	if s := f.one("SELECT status || ': ' || reason FROM stock_reservation WHERE order_id = $1", o.ID()); s != "REJECTED: out of stock: OOS-7" {
		t.Errorf("reservation %q", s)
	}
	if r := f.one("SELECT payload->>'reason' FROM message_outbox WHERE aggregate_id = $1 AND message_type = 'order.rejected'", o.ID().String()); r != "out of stock" {
		t.Errorf("order.rejected reason %q", r)
	}
}

// Stale messages are acknowledged and recorded as ignored with the reason;
// impossible ones, and messages about orders that do not exist, are parked.
func TestStaleAndImpossibleMessages(t *testing.T) {
	t.Parallel()
	f := setup(t, options{})

	cancelled := f.createOrder("c")
	f.setStatus(cancelled.ID(), domain.StatusCancelled)
	stale := f.send(domain.FulfillmentCompletedV1{ID: cancelled.ID(), ReservationID: uuid.New()}, "c")
	row := f.inboxRow(fulfillment.Name, stale)
	if row.Status != inbox.StatusProcessed || row.Outcome != inbox.OutcomeIgnored || !strings.Contains(row.OutcomeReason, "CANCELLED") {
		t.Errorf("completed for a cancelled order: %+v", row)
	}

	requested := f.createOrder("c")
	f.setStatus(requested.ID(), domain.StatusFulfillmentRequested)
	again := f.send(domain.SubmittedMessage(requested), "c") // a second order.submitted, another id
	if row := f.inboxRow(fulfillment.Name, again); row.Outcome != inbox.OutcomeIgnored {
		t.Errorf("submitted for a requested order: %+v", row)
	}

	submitted := f.createOrder("c")
	impossible := f.send(domain.FulfillmentCompletedV1{ID: submitted.ID(), ReservationID: uuid.New()}, "c")
	if row := f.inboxRow(fulfillment.Name, impossible); row.Status != inbox.StatusPermanentFailed || row.LastErrorCode != "invalid_transition" {
		t.Errorf("completed for a submitted order: %+v", row)
	}
	missing := f.send(domain.OrderSubmittedV1{ID: uuid.New(), CustomerID: "c", Currency: "EUR", TotalCents: 100,
		Items: []domain.ItemLine{{SKU: "A-1", Quantity: 1, UnitPriceCents: 100}}}, "c")
	if row := f.inboxRow(fulfillment.Name, missing); row.Status != inbox.StatusPermanentFailed || row.LastErrorCode != "order_not_found" {
		t.Errorf("submitted for no order: %+v", row)
	}

	if got := f.status(cancelled.ID()); got != domain.StatusCancelled {
		t.Errorf("the cancelled order is %s", got)
	}
	if got := f.status(submitted.ID()); got != domain.StatusSubmitted {
		t.Errorf("the submitted order is %s", got)
	}
	parked := 0
	testenv.WaitFor(t, 10*time.Second, "2 parked messages", func() bool {
		parked = int(queueDepth(t, f.amqpURL, inbox.ParkingLotName(inbox.QueueName(fulfillment.Name))))
		return parked == 2
	})
}

func queueDepth(t *testing.T, url, queue string) int {
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

// Two different messages for one order at once (completed and rejected):
// only one wins; the other finds the order moved and is ignored.
func TestConflictingMessagesOneWins(t *testing.T) {
	t.Parallel()
	f := setup(t, options{})
	for range 10 {
		o := f.createOrder("c")
		f.setStatus(o.ID(), domain.StatusFulfillmentRequested)
		var wg sync.WaitGroup
		var completed, rejected string
		wg.Go(func() { completed = f.send(domain.FulfillmentCompletedV1{ID: o.ID(), ReservationID: uuid.New()}, "c") })
		wg.Go(func() { rejected = f.send(domain.FulfillmentRejectedV1{ID: o.ID(), Reason: "r"}, "c") })
		wg.Wait()
		a, b := f.inboxRow(fulfillment.Name, completed), f.inboxRow(fulfillment.Name, rejected)
		if (a.Outcome == inbox.OutcomeApplied) == (b.Outcome == inbox.OutcomeApplied) {
			t.Fatalf("completed %+v, rejected %+v: want exactly one applied", a, b)
		}
		final := f.status(o.ID())
		if (a.Outcome == inbox.OutcomeApplied && final != domain.StatusFulfilled) || (b.Outcome == inbox.OutcomeApplied && final != domain.StatusRejected) {
			t.Fatalf("final status %s disagrees with the inbox", final)
		}
		if n := f.one("SELECT count(*)::text FROM order_state_transition WHERE order_id = $1 AND from_status = 'FULFILLMENT_REQUESTED'", o.ID()); n != "1" {
			t.Fatalf("%s transitions out of FULFILLMENT_REQUESTED", n)
		}
	}
}

// Cancels racing the fulfillment of the same orders, through the API: every
// order ends in one consistent final state.
func TestCancelRacingFulfillment(t *testing.T) {
	t.Parallel()
	f := setup(t, options{relay: true, api: true})
	var ids []uuid.UUID
	for i := range 30 {
		o := f.createOrder(fmt.Sprint("race-", i), "A-1")
		ids = append(ids, o.ID())
	}
	var wg sync.WaitGroup
	statuses := make([]int, len(ids))
	for i, id := range ids {
		wg.Go(func() {
			time.Sleep(time.Duration(i) * 3 * time.Millisecond) // spread over the flow
			// A 503 wrote nothing (a lock or statement timeout on a loaded
			// machine, say): the client retries, as the API asks, until the
			// cancel gets its answer.
			for range 20 {
				req, _ := http.NewRequestWithContext(f.ctx, http.MethodPost, f.api.URL+"/v1/orders/"+id.String()+"/cancel", nil)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				resp.Body.Close()
				if statuses[i] = resp.StatusCode; statuses[i] != http.StatusServiceUnavailable {
					return
				}
				time.Sleep(100 * time.Millisecond)
			}
		})
	}
	wg.Wait()

	outcome := map[string]int{}
	for i, id := range ids {
		testenv.WaitFor(t, 20*time.Second, "a final status", func() bool { return f.status(id).Final() })
		final := f.status(id)
		history := f.transitions(id)
		switch {
		case final == domain.StatusCancelled && statuses[i] == http.StatusOK:
			// The warehouse hears of the cancel; whatever it reserved is released.
			testenv.WaitFor(t, 20*time.Second, "the reservation to be settled", func() bool {
				s := f.one("SELECT status FROM stock_reservation WHERE order_id = $1", id)
				return s == "RELEASED" || s == ""
			})
		case final == domain.StatusFulfilled && statuses[i] == http.StatusConflict:
			if s := f.one("SELECT status FROM stock_reservation WHERE order_id = $1", id); s != "RESERVED" {
				t.Errorf("fulfilled order %s has reservation %q", id, s)
			}
		default:
			t.Errorf("order %s: %s after a cancel answered %d (%v)", id, final, statuses[i], history)
		}
		finals := 0
		for _, h := range history {
			if to := domain.Status(h[strings.Index(h, ">")+1:]); to.Final() {
				finals++
			}
		}
		if finals != 1 {
			t.Errorf("order %s: %d transitions into a final status: %v", id, finals, history)
		}
		outcome[string(final)]++
	}
	t.Logf("outcomes: %v", outcome)
}

// The warehouse's business idempotency: a cancel that arrives before the
// fulfillment request leaves a tombstone, and the late request reserves
// nothing.
func TestWarehouseCancelBeforeRequest(t *testing.T) {
	t.Parallel()
	f := setup(t, options{})
	o := f.createOrder("c", "A-1")
	cancelled := f.send(domain.OrderCancelledV1{ID: o.ID()}, "c")
	if row := f.inboxRow(warehouse.Name, cancelled); row.Outcome != inbox.OutcomeApplied {
		t.Fatalf("cancel: %+v", row)
	}
	request := f.send(domain.FulfillmentRequestedV1{ID: o.ID(), Items: []domain.ItemLine{{SKU: "A-1", Quantity: 1}}}, "c")
	row := f.inboxRow(warehouse.Name, request)
	if row.Outcome != inbox.OutcomeIgnored || !strings.Contains(row.OutcomeReason, "cancelled") {
		t.Fatalf("late request: %+v", row)
	}
	if s := f.one("SELECT status FROM stock_reservation WHERE order_id = $1", o.ID()); s != "RELEASED" {
		t.Fatalf("reservation %s", s)
	}
	if n := f.one("SELECT count(*)::text FROM message_outbox WHERE aggregate_id = $1 AND message_type LIKE 'fulfillment.%'", o.ID().String()); n != "0" {
		t.Fatalf("the warehouse answered a cancelled order (%s messages)", n)
	}
}

// webhook records the calls it receives and answers from a script.
type webhook struct {
	mu      sync.Mutex
	keys    []string
	answers []int // status per call; the last one repeats
	server  *httptest.Server
}

func newWebhook(t *testing.T, answers ...int) *webhook {
	w := &webhook{answers: answers}
	w.server = httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		w.mu.Lock()
		w.keys = append(w.keys, r.Header.Get(notification.HeaderIdempotencyKey))
		status := w.answers[min(len(w.keys), len(w.answers))-1]
		w.mu.Unlock()
		rw.WriteHeader(status)
	}))
	t.Cleanup(w.server.Close)
	return w
}

func (w *webhook) calls() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.keys...)
}

// Every retry of a notification reaches the webhook with the same
// Idempotency-Key; the notification is SENT once it is accepted.
func TestWebhookGetsTheSameIdempotencyKeyOnEveryRetry(t *testing.T) {
	t.Parallel()
	hook := newWebhook(t, http.StatusServiceUnavailable, http.StatusServiceUnavailable, http.StatusOK)
	f := setup(t, options{webhook: hook.server.URL})
	o := f.createOrder("c")
	id := f.send(domain.SubmittedMessage(o), "c")
	row := f.inboxRow(notification.Name, id)
	calls := hook.calls()
	if row.Status != inbox.StatusProcessed || len(calls) != 3 || calls[0] == "" || calls[0] != calls[1] || calls[1] != calls[2] {
		t.Fatalf("inbox %+v, webhook keys %v", row, calls)
	}
	if s := f.one("SELECT status || ' ' || attempt_count || ' ' || notification_id FROM customer_notification WHERE order_id = $1", o.ID()); s != "SENT 3 "+calls[0] {
		t.Fatalf("notification %q", s)
	}
}

// A webhook that refuses the notification (4xx) is a permanent failure:
// the message is parked, the notification FAILED, and no retry storm.
func TestWebhookRejectionParks(t *testing.T) {
	t.Parallel()
	hook := newWebhook(t, http.StatusUnprocessableEntity)
	f := setup(t, options{webhook: hook.server.URL})
	o := f.createOrder("c")
	id := f.send(domain.SubmittedMessage(o), "c")
	row := f.inboxRow(notification.Name, id)
	if row.Status != inbox.StatusPermanentFailed || row.LastErrorCode != "webhook_rejected" || len(hook.calls()) != 1 {
		t.Fatalf("inbox %+v, %d calls", row, len(hook.calls()))
	}
	if s := f.one("SELECT status FROM customer_notification WHERE order_id = $1", o.ID()); s != "FAILED" {
		t.Fatalf("notification %s", s)
	}
}

// A lock wait longer than DB_LOCK_TIMEOUT is a transient failure: recorded
// RETRYABLE_FAILED with its code, retried after a delay, applied once when
// the lock is gone.
func TestLockTimeoutIsRetried(t *testing.T) {
	t.Parallel()
	f := setup(t, options{})
	o := f.createOrder("c")
	holder, err := f.pool.Begin(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := holder.Exec(f.ctx, "SELECT 1 FROM orders WHERE order_id = $1 FOR UPDATE", o.ID()); err != nil {
		t.Fatal(err)
	}
	id := f.send(domain.SubmittedMessage(o), "c")
	testenv.WaitFor(t, 10*time.Second, "the lock timeout to be recorded", func() bool {
		row, err := inboxadmin.Get(f.ctx, f.pool, fulfillment.Name, id)
		return err == nil && row.Status == inbox.StatusRetryableFailed && row.LastErrorCode == "lock_timeout"
	})
	if err := holder.Rollback(f.ctx); err != nil {
		t.Fatal(err)
	}
	row := f.inboxRow(fulfillment.Name, id)
	if row.Status != inbox.StatusProcessed || row.Attempts < 2 || f.status(o.ID()) != domain.StatusFulfillmentRequested {
		t.Fatalf("after the lock: %+v, order %s", row, f.status(o.ID()))
	}
	if n := f.one("SELECT count(*)::text FROM order_state_transition WHERE order_id = $1", o.ID()); n != "2" {
		t.Fatalf("%s transitions", n)
	}
}
