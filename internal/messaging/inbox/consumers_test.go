package inbox_test

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/logctx"
	"github.com/yourorg/orders/internal/messaging"
	"github.com/yourorg/orders/internal/messaging/inbox"
	"github.com/yourorg/orders/internal/messaging/inbox/inboxadmin"
	"github.com/yourorg/orders/internal/messaging/outbox"
	"github.com/yourorg/orders/internal/testenv"
)

// The delivery wrapper, tested with a handler whose effect is a row in a
// table of the test's own: how many rows a message left is how many times
// its effect was applied.

const testConsumer = "tester"

type consumerBundle struct {
	t       *testing.T
	ctx     context.Context
	pool    *pgxpool.Pool // the test's own connections
	dbURL   string
	amqpURL string
	ch      *amqp.Channel    // the test's own channel, the exchange declared
	metrics *testenv.Metrics // shared by the test's consumers
	handler *effectHandler
	tracer  trace.TracerProvider // optional
	logs    *syncBuffer          // optional: capture the JSON logs
	// consumerDB, when set, is the URL the consumers connect to (a proxy
	// in front of the test's database); default dbURL.
	consumerDB string
	// dbTracer, when set, sees every query of the consumers' pool.
	dbTracer pgx.QueryTracer
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func setupConsumer(t *testing.T) *consumerBundle {
	t.Helper()
	db := testenv.NewDatabase(t, outbox.Schema, inbox.Schema)
	b := &consumerBundle{t: t, ctx: t.Context(), pool: db.Pool, dbURL: db.URL, amqpURL: testenv.NewVhost(t),
		metrics: testenv.NewMetrics(), handler: &effectHandler{failures: map[string]int{}}}
	b.ch = testenv.NewChannel(t, b.amqpURL)
	if err := messaging.DeclareExchange(b.ch, testExchange); err != nil {
		t.Fatal(err)
	}
	_, err := b.pool.Exec(b.ctx, `CREATE TABLE test_effect (message_id text NOT NULL, created_at timestamptz NOT NULL DEFAULT now(), txid bigint NOT NULL DEFAULT txid_current(), seq bigserial)`)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// directAndThroughPgBouncer runs test in two subtests, each on a bundle
// of its own: with the consumers' pool straight to the test's database
// ("direct"), and through PgBouncer in transaction mode, with the pooler's
// default settings (testenv.NewPgBouncer), in front of it.
func directAndThroughPgBouncer(t *testing.T, test func(t *testing.T, b *consumerBundle)) {
	for _, pooled := range []bool{false, true} {
		t.Run(map[bool]string{false: "direct", true: "through PgBouncer"}[pooled], func(t *testing.T) {
			t.Parallel()
			b := setupConsumer(t)
			if pooled {
				b.consumerDB = testenv.NewPgBouncer(t, b.dbURL).URL(b.dbURL)
			}
			test(t, b)
		})
	}
}

func (b *consumerBundle) counter(name string) int64 {
	b.t.Helper()
	return b.metrics.Counter(b.t, name)
}

// testerConsumer is the consumer the tests run: it reads order.cancelled
// with h.
func testerConsumer(h func(ctx context.Context, tx pgx.Tx, d *inbox.Delivery) (inbox.Outcome, error)) *inbox.Consumer {
	c := inbox.NewConsumer(testConsumer)
	inbox.Handle(c, func(ctx context.Context, tx pgx.Tx, d *inbox.Delivery, _ cancelledV1) (inbox.Outcome, error) {
		return h(ctx, tx, d)
	})
	return c
}

// effectHandler inserts one test_effect row per application, and emits
// order.fulfilled. It can be told to fail a message a number of times
// (transiently or permanently), to fail after its effect, or to wait.
type effectHandler struct {
	mu          sync.Mutex
	failures    map[string]int // message id -> transient failures left (-1: forever)
	permanent   map[string]bool
	panics      map[string]bool // a bug: the handler panics on this message
	failAfter   map[string]bool // fail after writing the effect (the rollback must remove it)
	hold        chan struct{}   // when set, each Handle waits on it
	delay       time.Duration
	calls       atomic.Int64
	attemptsSaw []int
}

func (h *effectHandler) Handle(ctx context.Context, tx pgx.Tx, d *inbox.Delivery) (inbox.Outcome, error) {
	h.calls.Add(1)
	if h.hold != nil {
		select {
		case <-h.hold:
		case <-ctx.Done():
			return inbox.Outcome{}, ctx.Err()
		}
	}
	if h.delay > 0 {
		time.Sleep(h.delay)
	}
	h.mu.Lock()
	h.attemptsSaw = append(h.attemptsSaw, d.Attempt)
	left := h.failures[d.MessageID]
	if left > 0 {
		h.failures[d.MessageID] = left - 1
	}
	permanent, failAfter, panics := h.permanent[d.MessageID], h.failAfter[d.MessageID], h.panics[d.MessageID]
	h.mu.Unlock()
	if panics {
		if _, err := tx.Exec(ctx, "INSERT INTO test_effect (message_id) VALUES ($1)", d.MessageID); err != nil {
			return inbox.Outcome{}, err
		}
		var effects map[string]*int
		*effects["x"]++ // a nil dereference: the kind of bug no retry fixes
	}
	if permanent {
		return inbox.Outcome{}, inbox.Permanent("test_permanent", errors.New("this message can never work"))
	}
	if left != 0 {
		return inbox.Outcome{}, inbox.Retryable("test_transient", errors.New("the downstream is down"))
	}
	if _, err := tx.Exec(ctx, "INSERT INTO test_effect (message_id) VALUES ($1)", d.MessageID); err != nil {
		return inbox.Outcome{}, err
	}
	if failAfter {
		return inbox.Outcome{}, errors.New("failed after the effect")
	}
	return inbox.Applied(fulfilledV1{ID: d.Message.(cancelledV1).ID}), nil
}

func (h *effectHandler) set(f func(h *effectHandler)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	f(h)
}

func testConsumerConfig() inbox.Config {
	return inbox.Config{
		Exchange: testExchange, FollowUps: outbox.Writer{Producer: "tester", AggregateType: "test"},
		Prefetch: 8, Workers: 4, MaxAttempts: 3,
		RetryDelays:   []time.Duration{100 * time.Millisecond, 200 * time.Millisecond},
		DeliveryLimit: 5, ProcessingLease: 2 * time.Second, ShutdownTimeout: 2 * time.Second,
	}
}

type runningConsumers struct {
	*inbox.Consumers
	stop func()
}

// start runs the test consumer (and any other specs) until the test ends.
func (b *consumerBundle) start(cfg inbox.Config, amqpURL string, faults inbox.Faults, consumers ...*inbox.Consumer) *runningConsumers {
	b.t.Helper()
	pool, err := database.NewPool(b.ctx, database.PoolConfig{URL: cmp.Or(b.consumerDB, b.dbURL), AppName: "consumer-under-test", Tracer: b.dbTracer})
	if err != nil {
		b.t.Fatal(err)
	}
	b.t.Cleanup(pool.Close)
	if len(consumers) == 0 {
		consumers = []*inbox.Consumer{testerConsumer(b.handler.Handle)}
	}
	logger := testenv.Logger()
	if b.logs != nil { // JSON logs with the context's attributes, as the binaries write them
		logger = slog.New(logctx.NewHandler(slog.NewJSONHandler(b.logs, nil)))
	}
	cfg.Faults = faults
	cs, err := inbox.NewConsumers(cfg, messaging.Deps{
		Pool: pool, AMQPURL: amqpURL, Logger: logger, MeterProvider: b.metrics.Provider, TracerProvider: b.tracer,
	}, consumers...)
	if err != nil {
		b.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = cs.Run(ctx)
	}()
	var once sync.Once
	stop := func() { once.Do(func() { cancel(); <-done }) }
	b.t.Cleanup(stop)
	testenv.WaitFor(b.t, 10*time.Second, "the consumers to be ready", func() bool { return cs.Ready(b.ctx) == nil })
	return &runningConsumers{Consumers: cs, stop: stop}
}

// message is a valid order.cancelled delivery with a fresh id.
func message() amqp.Publishing {
	body := fmt.Sprintf(`{"id":%q}`, uuid.NewString())
	return amqp.Publishing{
		MessageId: uuid.NewString(), Type: typeCancelled, ContentType: messaging.ContentTypeJSON,
		DeliveryMode: amqp.Persistent, CorrelationId: "corr-" + uuid.NewString()[:8],
		Headers: amqp.Table{messaging.HeaderMessageVersion: int32(1)}, Body: []byte(body),
	}
}

// publish sends msg through the exchange (routed by its type) and waits
// for the broker's confirm.
func (b *consumerBundle) publish(msg amqp.Publishing) {
	b.t.Helper()
	b.publishTo(testExchange, msg.Type, msg)
}

func (b *consumerBundle) publishTo(exchange, key string, msg amqp.Publishing) {
	b.t.Helper()
	conn, err := amqp.Dial(b.amqpURL)
	if err != nil {
		b.t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		b.t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		b.t.Fatal(err)
	}
	dc, err := ch.PublishWithDeferredConfirmWithContext(b.ctx, exchange, key, true, false, msg)
	if err != nil || !dc.Wait() {
		b.t.Fatalf("publish: %v", err)
	}
}

func (b *consumerBundle) effects(messageID string) int {
	b.t.Helper()
	var n int
	if err := b.pool.QueryRow(b.ctx, "SELECT count(*) FROM test_effect WHERE message_id = $1", messageID).Scan(&n); err != nil {
		b.t.Fatal(err)
	}
	return n
}

func (b *consumerBundle) inboxRow(messageID string) inboxadmin.Row {
	b.t.Helper()
	row, err := inboxadmin.Get(b.ctx, b.pool, testConsumer, messageID)
	if err != nil && !errors.Is(err, database.ErrNotFound) {
		b.t.Fatal(err)
	}
	return row
}

func (b *consumerBundle) waitInbox(messageID, status string) inboxadmin.Row {
	b.t.Helper()
	var row inboxadmin.Row
	testenv.WaitFor(b.t, 15*time.Second, fmt.Sprintf("message %s to be %s", messageID, status), func() bool {
		row = b.inboxRow(messageID)
		return row.Status == status
	})
	return row
}

// parked takes every message out of the parking lot.
func (b *consumerBundle) parked(want int) []amqp.Delivery {
	b.t.Helper()
	queue := inbox.ParkingLotName(inbox.QueueName(testConsumer))
	var got []amqp.Delivery
	testenv.WaitFor(b.t, 15*time.Second, fmt.Sprintf("%d parked messages", want), func() bool {
		for {
			d, ok, err := b.ch.Get(queue, true)
			if err != nil {
				b.t.Fatal(err)
			}
			if !ok {
				break
			}
			got = append(got, d)
		}
		return len(got) >= want
	})
	return got
}

func (b *consumerBundle) ready(queue string) int {
	b.t.Helper()
	q, err := b.ch.QueueDeclarePassive(queue, true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
	if err != nil {
		b.t.Fatal(err)
	}
	return q.Messages
}

// A first delivery inserts the inbox row and applies the effect and the
// follow-up outbox row, in one transaction; a duplicate after PROCESSED
// applies nothing and is acknowledged.
func TestFirstDeliveryAppliesAndDuplicateIsAcknowledged(t *testing.T) {
	t.Parallel()
	b := setupConsumer(t)
	rc := b.start(testConsumerConfig(), b.amqpURL, nil)
	msg := message()
	b.publish(msg)
	row := b.waitInbox(msg.MessageId, inbox.StatusProcessed)
	if row.Outcome != inbox.OutcomeApplied || row.Attempts != 1 || b.effects(msg.MessageId) != 1 {
		t.Fatalf("after the first delivery: %+v, %d effects", row, b.effects(msg.MessageId))
	}
	var causation, correlation, producer string
	err := b.pool.QueryRow(b.ctx, `SELECT headers->>'causation_id', headers->>'correlation_id', headers->>'app_id'
		FROM message_outbox WHERE message_type = 'test.fulfilled'`).Scan(&causation, &correlation, &producer)
	if err != nil || causation != msg.MessageId || correlation != msg.CorrelationId || producer != "tester" {
		t.Fatalf("follow-up outbox row: causation %q correlation %q producer %q: %v", causation, correlation, producer, err)
	}

	b.publish(msg) // the same message again
	testenv.WaitFor(t, 10*time.Second, "the duplicate to be counted", func() bool { return b.counter("consumer.messages.duplicates") == 1 })
	rc.stop()
	if n := b.effects(msg.MessageId); n != 1 {
		t.Fatalf("%d effects after a duplicate", n)
	}
	if n := b.ready(inbox.QueueName(testConsumer)); n != 0 {
		t.Fatalf("%d messages left in the queue: the duplicate was not acknowledged", n)
	}
	var outbox int
	_ = b.pool.QueryRow(b.ctx, "SELECT count(*) FROM message_outbox").Scan(&outbox)
	if outbox != 1 {
		t.Fatalf("%d outbox rows, want 1", outbox)
	}
}

// A handler failure does not mark the message PROCESSED: its transaction
// rolls back the inbox row's progress and the effect together. The retry,
// after a delay, applies the effect once.
func TestHandlerFailureRollsBackThenRetrySucceeds(t *testing.T) {
	t.Parallel()
	b := setupConsumer(t)
	msg := message()
	b.handler.set(func(h *effectHandler) { h.failAfter = map[string]bool{msg.MessageId: true} })
	cfg := testConsumerConfig()
	cfg.RetryDelays = []time.Duration{time.Second}
	b.start(cfg, b.amqpURL, nil)
	b.publish(msg)

	row := b.waitInbox(msg.MessageId, inbox.StatusRetryableFailed)
	if n := b.effects(msg.MessageId); n != 0 || row.LastErrorCode != "handler_error" || row.Attempts != 1 {
		t.Fatalf("after the failure: %d effects, row %+v", n, row)
	}
	var outbox int
	_ = b.pool.QueryRow(b.ctx, "SELECT count(*) FROM message_outbox").Scan(&outbox)
	if outbox != 0 {
		t.Fatal("the failed attempt's outbox row survived its rollback")
	}
	b.handler.set(func(h *effectHandler) { h.failAfter = nil })
	row = b.waitInbox(msg.MessageId, inbox.StatusProcessed)
	if n := b.effects(msg.MessageId); n != 1 || row.Attempts != 2 {
		t.Fatalf("after the retry: %d effects, row %+v", n, row)
	}
	if got := b.counter("consumer.messages.retried"); got != 1 {
		t.Fatalf("consumer.messages.retried = %d", got)
	}
}

// Transient failures go round the retry queues with growing delays; the
// message carries its attempt; the next success applies it once.
func TestTransientFailuresThenSuccess(t *testing.T) {
	t.Parallel()
	b := setupConsumer(t)
	msg := message()
	b.handler.set(func(h *effectHandler) { h.failures[msg.MessageId] = 2 })
	b.start(testConsumerConfig(), b.amqpURL, nil)
	b.publish(msg)
	row := b.waitInbox(msg.MessageId, inbox.StatusProcessed)
	if n := b.effects(msg.MessageId); n != 1 || row.Attempts != 3 {
		t.Fatalf("%d effects, row %+v", n, row)
	}
	b.handler.mu.Lock()
	defer b.handler.mu.Unlock()
	if fmt.Sprint(b.handler.attemptsSaw) != "[1 2 3]" {
		t.Fatalf("attempts seen by the handler: %v", b.handler.attemptsSaw)
	}
}

// When the attempts run out the message is POISONED and parked with the
// reason, and nothing was applied.
func TestAttemptsExhaustedPoisonsAndParks(t *testing.T) {
	t.Parallel()
	b := setupConsumer(t)
	msg := message()
	b.handler.set(func(h *effectHandler) { h.failures[msg.MessageId] = -1 })
	b.start(testConsumerConfig(), b.amqpURL, nil)
	b.publish(msg)
	row := b.waitInbox(msg.MessageId, inbox.StatusPoisoned)
	parked := b.parked(1)[0]
	if parked.MessageId != msg.MessageId || parked.Headers[inbox.HeaderParkedCode] != "test_transient" ||
		parked.Headers[inbox.HeaderParkedAttempts] != int32(3) || parked.Headers[inbox.HeaderParkedConsumer] != testConsumer ||
		string(parked.Body) != string(msg.Body) {
		t.Fatalf("parked: %+v", parked.Headers)
	}
	if n := b.effects(msg.MessageId); n != 0 || row.Attempts != 3 || row.LastErrorCode != "test_transient" {
		t.Fatalf("%d effects, row %+v", n, row)
	}
	if got := b.counter("consumer.messages.poisoned"); got != 1 {
		t.Fatalf("consumer.messages.poisoned = %d", got)
	}
}

// Poison messages are parked with their reason at once, and the messages
// around them flow. A body that breaks the schema of its type is parked as
// schema_violation with the validator's words; the validator is asked
// only about the (type, version)s the consumer has a handler for.
func TestPoisonMessagesAreParkedAndTheQueueFlows(t *testing.T) {
	t.Parallel()
	b := setupConsumer(t)
	cfg := testConsumerConfig()
	cfg.ValidateBody = testSchema
	b.start(cfg, b.amqpURL, nil)
	queue := inbox.QueueName(testConsumer)

	badJSON := message()
	badJSON.Body = []byte(`{"id":`)
	unknownType := message()
	unknownType.Type = "test.exploded"
	badVersion := message()
	badVersion.Headers = amqp.Table{messaging.HeaderMessageVersion: int32(9)}
	noVersion := message()
	noVersion.Headers = nil
	noID := message()
	noID.MessageId = ""
	noOrder := message()
	noOrder.Body = []byte(`{}`)
	xml := message()
	xml.ContentType = "application/xml"
	permanent := message()
	b.handler.set(func(h *effectHandler) { h.permanent = map[string]bool{permanent.MessageId: true} })
	// An id the decoder reads (uuid.Parse takes the URN form) but the
	// schema refuses.
	urn := message()
	urn.Body = []byte(fmt.Sprintf(`{"id":"urn:uuid:%s"}`, uuid.NewString()))

	poison := []amqp.Publishing{badJSON, unknownType, badVersion, noVersion, noID, noOrder, xml, permanent, urn}
	var good []amqp.Publishing
	for _, p := range poison {
		g := message()
		good = append(good, g)
		b.publish(g)
		b.publishTo("", queue, p) // straight into the queue, whatever its type
	}
	for _, g := range good {
		b.waitInbox(g.MessageId, inbox.StatusProcessed)
	}
	parked := b.parked(len(poison))
	codes := map[string]int{}
	for _, p := range parked {
		code, _ := p.Headers[inbox.HeaderParkedCode].(string)
		codes[code]++
		if reason, _ := p.Headers[inbox.HeaderParkedReason].(string); reason == "" {
			t.Errorf("parked %s without a reason", p.MessageId)
		}
		if p.MessageId != "" {
			if row := b.inboxRow(p.MessageId); row.Status != inbox.StatusPermanentFailed || row.LastErrorCode != code {
				t.Errorf("inbox of parked %s: %+v", p.MessageId, row)
			}
		}
		if reason, _ := p.Headers[inbox.HeaderParkedReason].(string); p.MessageId == urn.MessageId &&
			reason != "schema_violation: at /id: not a UUID in canonical form" {
			t.Errorf("parked %s (%s) with reason %q, want the validator's", p.MessageId, code, reason)
		}
		// A message whose payload was read names what it is about.
		if p.MessageId == permanent.MessageId && !bytes.Contains(permanent.Body, []byte(fmt.Sprint(p.Headers[inbox.HeaderParkedAggregateID]))) {
			t.Errorf("parked %s names aggregate %v, body %s", p.MessageId, p.Headers[inbox.HeaderParkedAggregateID], permanent.Body)
		}
	}
	want := map[string]int{"malformed_message": 3, "unknown_type": 1, "unsupported_version": 1, "missing_version": 1,
		"missing_message_id": 1, "test_permanent": 1, "schema_violation": 1}
	if fmt.Sprint(codes) != fmt.Sprint(want) {
		t.Fatalf("parked codes %v, want %v", codes, want)
	}
	if got := b.counter("consumer.messages.parked"); got != int64(len(poison)) {
		t.Fatalf("consumer.messages.parked = %d", got)
	}
}

// The same message delivered three times at once, to three workers, is
// applied once: the inbox row's primary key makes two of them wait and
// then find it PROCESSED. The first delivery's handler holds its
// transaction open until the two others are waiting on its lock, so the
// three were in flight together: the test checks that they were.
func TestSameMessageThreeTimesConcurrently(t *testing.T) {
	t.Parallel()
	b := setupConsumer(t)
	var overlapped atomic.Bool
	barrier := testerConsumer(func(ctx context.Context, tx pgx.Tx, d *inbox.Delivery) (inbox.Outcome, error) {
		deadline := time.Now().Add(20 * time.Second)
		for !overlapped.Load() && time.Now().Before(deadline) {
			var waiting int
			if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE datname = current_database() AND application_name = 'consumer-under-test' AND wait_event_type = 'Lock'`).Scan(&waiting); err != nil {
				return inbox.Outcome{}, err
			}
			overlapped.Store(waiting == 2)
			time.Sleep(20 * time.Millisecond)
		}
		return b.handler.Handle(ctx, tx, d)
	})
	b.start(testConsumerConfig(), b.amqpURL, nil, barrier)
	msg := message()
	for range 3 {
		b.publish(msg)
	}
	testenv.WaitFor(t, 30*time.Second, "three deliveries to be done", func() bool {
		return b.counter("consumer.messages.duplicates") == 2 && b.counter("consumer.messages.processed") == 1
	})
	if !overlapped.Load() {
		t.Fatal("the two other deliveries never waited on the first one's transaction: they were not in flight together")
	}
	if n := b.effects(msg.MessageId); n != 1 {
		t.Fatalf("%d effects", n)
	}
}

// The crash window: the transaction committed, the ack never reached the
// broker (the connection is cut right there). The broker delivers the
// message again, and the inbox makes the redelivery a duplicate: with the
// consumers' pool straight to the database and through PgBouncer.
func TestCrashAfterCommitBeforeAck(t *testing.T) {
	t.Parallel()
	directAndThroughPgBouncer(t, func(t *testing.T, b *consumerBundle) {
		proxy := testenv.NewProxy(t, testenv.HostPort(b.amqpURL))
		var cut atomic.Bool
		b.start(testConsumerConfig(), proxy.Rewrite(b.amqpURL), inbox.AfterCommit(func(*inbox.Delivery) {
			if cut.CompareAndSwap(false, true) {
				proxy.Cut()
				go func() { time.Sleep(300 * time.Millisecond); proxy.Restore() }()
			}
		}))
		msg := message()
		b.publish(msg)
		testenv.WaitFor(t, 20*time.Second, "the redelivery to be recognised", func() bool { return b.counter("consumer.messages.duplicates") >= 1 })
		if n := b.effects(msg.MessageId); n != 1 {
			t.Fatalf("%d effects", n)
		}
		if got := b.counter("consumer.messages.redelivered"); got < 1 {
			t.Fatalf("consumer.messages.redelivered = %d", got)
		}
	})
}

// Replaying from the parking lot: a message PROCESSED before is ignored by
// policy (acknowledged as a duplicate); a message that failed is processed
// again, now that its cause is fixed.
func TestReplayFromTheParkingLot(t *testing.T) {
	t.Parallel()
	b := setupConsumer(t)
	done, broken := message(), message()
	b.handler.set(func(h *effectHandler) { h.permanent = map[string]bool{broken.MessageId: true} })
	b.start(testConsumerConfig(), b.amqpURL, nil)
	b.publish(done)
	b.publish(broken)
	b.waitInbox(done.MessageId, inbox.StatusProcessed)
	b.waitInbox(broken.MessageId, inbox.StatusPermanentFailed)
	// The processed message lands in the parking lot too (as it would after
	// an ack lost to a crash and a delivery limit reached).
	b.publishTo("", inbox.ParkingLotName(inbox.QueueName(testConsumer)), done)
	testenv.WaitFor(t, 10*time.Second, "two messages in the parking lot", func() bool {
		return b.ready(inbox.ParkingLotName(inbox.QueueName(testConsumer))) == 2
	})

	b.handler.set(func(h *effectHandler) { h.permanent = nil }) // the fix
	moved, err := inboxadmin.Replay(b.ctx, b.amqpURL, testConsumer, inboxadmin.ReplayRequest{Limit: 10})
	if err != nil || len(moved) != 2 {
		t.Fatalf("replayed %v: %v", moved, err)
	}
	row := b.waitInbox(broken.MessageId, inbox.StatusProcessed)
	testenv.WaitFor(t, 10*time.Second, "the replayed duplicate", func() bool { return b.counter("consumer.messages.duplicates") == 1 })
	if b.effects(done.MessageId) != 1 || b.effects(broken.MessageId) != 1 || row.Attempts != 2 {
		t.Fatalf("effects %d and %d, row %+v", b.effects(done.MessageId), b.effects(broken.MessageId), row)
	}
	if n := b.ready(inbox.ParkingLotName(inbox.QueueName(testConsumer))); n != 0 {
		t.Fatalf("%d left in the parking lot", n)
	}
}

// If parking itself fails (the parking lot is gone), the delivery is not
// acknowledged: the broker keeps it, and it is parked once parking works.
func TestParkingFailureDoesNotAcknowledge(t *testing.T) {
	t.Parallel()
	b := setupConsumer(t)
	cfg := testConsumerConfig()
	cfg.DeliveryLimit = 50
	b.start(cfg, b.amqpURL, nil)
	dlq := inbox.ParkingLotName(inbox.QueueName(testConsumer))
	if _, err := b.ch.QueueDelete(dlq, false, false, false); err != nil {
		t.Fatal(err)
	}
	bad := message()
	bad.Body = []byte("not json")
	b.publish(bad)
	testenv.WaitFor(t, 15*time.Second, "the delivery to be given back", func() bool { return b.counter("consumer.messages.requeued") >= 1 })
	if row := b.inboxRow(bad.MessageId); row.Status != inbox.StatusPermanentFailed {
		t.Fatalf("inbox %+v", row)
	}
	topo := inbox.Topology{Consumer: testConsumer, Exchange: testExchange, Types: []string{typeCancelled}, RetryDelays: cfg.RetryDelays, DeliveryLimit: cfg.DeliveryLimit}
	if err := topo.Declare(b.ch); err != nil {
		t.Fatal(err)
	}
	if got := b.parked(1); got[0].MessageId != bad.MessageId {
		t.Fatalf("parked %s", got[0].MessageId)
	}
}

// On shutdown the consumer finishes the delivery in progress and leaves
// the ones it has not started unacknowledged, for redelivery.
func TestShutdownFinishesInProgressAndLeavesTheRest(t *testing.T) {
	t.Parallel()
	b := setupConsumer(t)
	b.handler.hold = make(chan struct{})
	cfg := testConsumerConfig()
	cfg.Workers = 1
	rc := b.start(cfg, b.amqpURL, nil)
	msgs := []amqp.Publishing{message(), message(), message()}
	for _, m := range msgs {
		b.publish(m)
	}
	testenv.WaitFor(t, 10*time.Second, "the first delivery to be in progress", func() bool { return b.handler.calls.Load() == 1 })

	stopped := make(chan struct{})
	go func() { rc.stop(); close(stopped) }()
	time.Sleep(200 * time.Millisecond) // shutdown has begun
	close(b.handler.hold)              // the delivery in progress completes
	<-stopped

	var applied []string
	for _, m := range msgs {
		if b.effects(m.MessageId) == 1 {
			applied = append(applied, m.MessageId)
		}
	}
	if len(applied) != 1 || b.handler.calls.Load() != 1 {
		t.Fatalf("applied %d messages (%d handler calls), want exactly the one in progress", len(applied), b.handler.calls.Load())
	}
	// The broker requeues what the closed channel left unacknowledged.
	testenv.WaitFor(t, 10*time.Second, "the 2 unstarted deliveries back in the queue", func() bool {
		return b.ready(inbox.QueueName(testConsumer)) == 2
	})
}

// A consumer takes over a message left PROCESSING by a worker that died
// between the two steps of an external side effect, once the lease ends.
func TestStaleProcessingIsTakenOverAfterTheLease(t *testing.T) {
	t.Parallel()
	b := setupConsumer(t)
	msg := message()
	var calls atomic.Int64
	takeover := testerConsumer(
		func(ctx context.Context, tx pgx.Tx, d *inbox.Delivery) (inbox.Outcome, error) {
			return inbox.Outcome{External: &inbox.External{
				Call: func(context.Context) error { calls.Add(1); return nil },
				Record: func(ctx context.Context, tx pgx.Tx, _ error) error {
					_, err := tx.Exec(ctx, "INSERT INTO test_effect (message_id) VALUES ($1)", d.MessageID)
					return err
				},
			}}, nil
		})
	// A dead worker's first step: the row committed PROCESSING.
	err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		if _, err := inbox.Begin(b.ctx, tx, inbox.Entry{Consumer: testConsumer, MessageID: msg.MessageId, Type: msg.Type, Version: 1, PayloadHash: "x"}, time.Second); err != nil {
			return err
		}
		return inbox.Hold(b.ctx, tx, testConsumer, msg.MessageId)
	})
	if err != nil {
		t.Fatal(err)
	}
	b.start(testConsumerConfig(), b.amqpURL, nil, takeover)
	b.publish(msg) // the redelivery
	row := b.waitInbox(msg.MessageId, inbox.StatusProcessed)
	if calls.Load() != 1 || b.effects(msg.MessageId) != 1 || row.Attempts != 2 {
		t.Fatalf("calls %d, effects %d, row %+v", calls.Load(), b.effects(msg.MessageId), row)
	}
	if got := b.counter("consumer.messages.retried"); got != 0 {
		t.Fatalf("retried = %d: finding the message busy is not a failed attempt", got)
	}
}

// The log line of a parked message names the message and the reason, and
// carries no payload.
func TestParkedMessageLogLine(t *testing.T) {
	t.Parallel()
	b := setupConsumer(t)
	b.logs = &syncBuffer{}
	b.start(testConsumerConfig(), b.amqpURL, nil)
	msg := message()
	msg.Headers = amqp.Table{messaging.HeaderMessageVersion: int32(7)}
	msg.Body = []byte(`{"id":"` + uuid.NewString() + `","customer_email":"jane@example.com"}`)
	b.publish(msg)
	b.waitInbox(msg.MessageId, inbox.StatusPermanentFailed)
	b.parked(1)

	var parked map[string]any
	testenv.WaitFor(t, 5*time.Second, "the parked log line", func() bool {
		for _, line := range strings.Split(b.logs.String(), "\n") {
			var entry map[string]any
			if json.Unmarshal([]byte(line), &entry) == nil && entry["msg"] == "message parked" && entry["message_id"] == msg.MessageId {
				parked = entry
				return true
			}
		}
		return false
	})
	if parked["reason_code"] != "unsupported_version" || !strings.Contains(fmt.Sprint(parked["reason"]), "version 7") ||
		parked["consumer_name"] != testConsumer || parked["correlation_id"] != msg.CorrelationId || parked["outcome"] != "parked" {
		t.Fatalf("parked log line: %v", parked)
	}
	if strings.Contains(b.logs.String(), "jane@example.com") || strings.Contains(b.logs.String(), "customer_email") {
		t.Fatalf("the payload leaked into the logs:\n%s", b.logs.String())
	}
}

// A message replayed from the parking lot is processed in a trace of its
// own, linked to the trace it came from.
func TestReplayedMessageLinksItsOriginalTrace(t *testing.T) {
	t.Parallel()
	b := setupConsumer(t)
	recorder := tracetest.NewSpanRecorder()
	b.tracer = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(recorder))
	msg := message()
	original := "4bf92f3577b34da6a3ce929d0e0e4736"
	msg.Headers["traceparent"] = "00-" + original + "-00f067aa0ba902b7-01"
	b.handler.set(func(h *effectHandler) { h.permanent = map[string]bool{msg.MessageId: true} })
	b.start(testConsumerConfig(), b.amqpURL, nil)
	b.publish(msg)
	b.waitInbox(msg.MessageId, inbox.StatusPermanentFailed)
	b.handler.set(func(h *effectHandler) { h.permanent = nil })
	if _, err := inboxadmin.Replay(b.ctx, b.amqpURL, testConsumer, inboxadmin.ReplayRequest{Limit: 1}); err != nil {
		t.Fatal(err)
	}
	b.waitInbox(msg.MessageId, inbox.StatusProcessed)

	var spans []sdktrace.ReadOnlySpan
	testenv.WaitFor(t, 5*time.Second, "two process spans", func() bool {
		spans = nil
		for _, s := range recorder.Ended() {
			if strings.HasPrefix(s.Name(), "process ") {
				spans = append(spans, s)
			}
		}
		return len(spans) == 2
	})
	first, replay := spans[0], spans[1]
	if first.SpanContext().TraceID().String() != original || first.Parent().TraceID().String() != original {
		t.Fatalf("the first delivery is not in the original trace: %v", first.SpanContext())
	}
	if replay.SpanContext().TraceID().String() == original || len(replay.Links()) != 1 ||
		replay.Links()[0].SpanContext.TraceID().String() != original {
		t.Fatalf("the replay: trace %s, links %v", replay.SpanContext().TraceID(), replay.Links())
	}
	if first.Status().Code.String() != "Error" {
		t.Fatalf("the parked delivery's span: status %v", first.Status())
	}
}

// A handler that panics does not take the process down: its transaction
// rolls back, the message is parked with the reason, the rest flows.
func TestHandlerPanicParksTheMessage(t *testing.T) {
	t.Parallel()
	b := setupConsumer(t)
	bad, good := message(), message()
	b.handler.set(func(h *effectHandler) { h.panics = map[string]bool{bad.MessageId: true} })
	b.start(testConsumerConfig(), b.amqpURL, nil)
	b.publish(bad)
	b.publish(good)
	row := b.waitInbox(bad.MessageId, inbox.StatusPermanentFailed)
	b.waitInbox(good.MessageId, inbox.StatusProcessed)
	parked := b.parked(1)[0]
	if row.LastErrorCode != "handler_panic" || parked.Headers[inbox.HeaderParkedCode] != "handler_panic" || b.effects(bad.MessageId) != 0 {
		t.Fatalf("inbox %+v, parked %v, %d effects", row, parked.Headers, b.effects(bad.MessageId))
	}
}

// A message id reused for a different body is a producer bug: the second
// body is not applied (its id says it was), but it is counted and logged.
func TestReusedMessageIDWithAnotherBodyIsCounted(t *testing.T) {
	t.Parallel()
	b := setupConsumer(t)
	b.start(testConsumerConfig(), b.amqpURL, nil)
	first := message()
	b.publish(first)
	b.waitInbox(first.MessageId, inbox.StatusProcessed)
	second := message()
	second.MessageId = first.MessageId
	b.publish(second)
	testenv.WaitFor(t, 10*time.Second, "the mismatch to be counted", func() bool { return b.counter("consumer.inbox.payload_mismatch") == 1 })
	if n := b.effects(first.MessageId); n != 1 {
		t.Fatalf("%d effects", n)
	}
}

// A process declares the queues of the consumers it does not run too
// (Config.AlsoDeclare), so that a message published while another
// consumer's process is down, or not started yet, still reaches that
// consumer's queue: mandatory would not notice it missing while any other
// reader's queue took the message.
func TestConsumersDeclareTheQueuesOfOthers(t *testing.T) {
	t.Parallel()
	b := setupConsumer(t)
	late := inbox.NewConsumer("late")
	inbox.Handle(late, func(context.Context, pgx.Tx, *inbox.Delivery, cancelledV1) (inbox.Outcome, error) {
		return inbox.Applied(), nil
	})
	cfg := testConsumerConfig()
	cfg.AlsoDeclare = []*inbox.Consumer{late}
	b.start(cfg, b.amqpURL, nil)
	msg := message()
	b.publish(msg)
	b.waitInbox(msg.MessageId, inbox.StatusProcessed)
	if n := b.ready(inbox.QueueName("late")); n != 1 {
		t.Fatalf("the late consumer's queue holds %d messages, want the one published before it started", n)
	}
	if n := b.ready(inbox.ParkingLotName(inbox.QueueName("late"))); n != 0 {
		t.Fatalf("its parking lot holds %d", n)
	}
}
