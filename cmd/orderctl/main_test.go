package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/yourorg/orders/internal/auth"
	"github.com/yourorg/orders/internal/config"
	"github.com/yourorg/orders/internal/consumer"
	"github.com/yourorg/orders/internal/consumer/consumertest"
	"github.com/yourorg/orders/internal/consumer/fulfillment"
	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/domain"
	"github.com/yourorg/orders/internal/messaging"
	"github.com/yourorg/orders/internal/messaging/inbox"
	"github.com/yourorg/orders/internal/messaging/inbox/inboxadmin"
	"github.com/yourorg/orders/internal/messaging/inbox/inboxtest"
	"github.com/yourorg/orders/internal/messaging/outbox"
	"github.com/yourorg/orders/internal/messaging/outbox/outboxadmin"
	"github.com/yourorg/orders/internal/messaging/outbox/outboxtest"
	"github.com/yourorg/orders/internal/store"
	"github.com/yourorg/orders/internal/testenv"
	"github.com/yourorg/orders/migrations"
)

// Every goroutine the tests start (consumers, a relay) ends with its test.
func TestMain(m *testing.M) { testenv.VerifyNoLeaks(m) }

// ctlEnv is orderctl's environment against a test's database and vhost.
type ctlEnv struct {
	t       *testing.T
	environ map[string]string
}

// newCtl runs orderctl on the database of dbURL as the operators' role,
// orders_operator, whatever user dbURL names: a command that needs more
// than the role's grants fails its test.
func newCtl(t *testing.T, dbURL, amqpURL string) *ctlEnv {
	return &ctlEnv{t: t, environ: map[string]string{
		"DATABASE_URL": testenv.AsRole(dbURL, migrations.RoleOperator), "AMQP_URL": amqpURL, "ORDERCTL_USER": "tester",
		// inboxtest's consumers retry after these delays, from one work
		// queue each (no partitions).
		"CONSUMER_RETRY_DELAYS": "50ms,100ms", "MESSAGE_PARTITIONS": "0", "LOG_LEVEL": "error",
	}}
}

// run runs orderctl and returns what it printed, or its error.
func (e *ctlEnv) run(args ...string) (string, error) {
	e.t.Helper()
	var stdout, stderr bytes.Buffer
	err := run(e.t.Context(), args, e.environ, &stdout, &stderr)
	return stdout.String(), err
}

// ok runs orderctl and fails the test on an error.
func (e *ctlEnv) ok(args ...string) string {
	e.t.Helper()
	out, err := e.run(args...)
	if err != nil {
		e.t.Fatalf("orderctl %s: %v", strings.Join(args, " "), err)
	}
	return out
}

// json runs orderctl with --json and decodes what it printed into v.
func (e *ctlEnv) json(v any, args ...string) {
	e.t.Helper()
	out := e.ok(append(args, "--json")...)
	if err := json.Unmarshal([]byte(out), v); err != nil {
		e.t.Fatalf("orderctl %s --json printed what is not JSON: %v\n%s", strings.Join(args, " "), err, out)
	}
}

func (e *ctlEnv) audit() []Audit {
	e.t.Helper()
	var r auditReport
	e.json(&r, "audit")
	return r.Entries
}

// A poison message parked by a running consumer: list and show see it and
// leave it; replay moves it back with its id, and since it fails again it is
// parked again, without the replay looping on it; discard removes it. Each
// change is in the audit with who and why.
func TestParkedMessages(t *testing.T) {
	t.Parallel()
	h := consumertest.Start(t, fulfillment.New(fulfillment.Config{MeterProvider: metricnoop.NewMeterProvider()}))
	ctl := newCtl(t, h.Pool.Config().ConnString(), h.AMQPURL)
	noSuchOrder := func() domain.OrderSubmittedV1 {
		return domain.OrderSubmittedV1{ID: uuid.New(), CustomerID: "c-1", Currency: "EUR", TotalCents: 100,
			Items: []domain.ItemLine{{SKU: "A-1", Quantity: 1, UnitPriceCents: 100}}}
	}
	poison := []string{ // their orders do not exist: order_not_found, parked at once
		h.Deliver(noSuchOrder()),
		h.Deliver(noSuchOrder()),
	}
	// parked waits until the parking lot holds both messages, replayed
	// these many times, and returns them by id.
	parked := func(replays ...int) map[string]inboxadmin.Parked {
		byID := map[string]inboxadmin.Parked{}
		testenv.WaitFor(t, 15*time.Second, fmt.Sprintf("both messages parked, replayed %v times", replays), func() bool {
			var list parkedListReport
			ctl.json(&list, "parked", "list", fulfillment.Name)
			clear(byID)
			for _, m := range list.Messages {
				byID[m.MessageID] = m
			}
			return len(list.Messages) == 2 && byID[poison[0]].ReplayCount == replays[0] && byID[poison[1]].ReplayCount == replays[1]
		})
		return byID
	}
	got := parked(0, 0)
	if m := got[poison[0]]; m.ReasonCode != "order_not_found" || m.Type != domain.TypeOrderSubmitted || m.AggregateID == "" {
		t.Fatalf("parked message: %+v", m)
	}

	// list and show leave the messages where they are.
	out := ctl.ok("parked", "list", fulfillment.Name)
	if !strings.Contains(out, poison[0]) || !strings.Contains(out, "order_not_found") {
		t.Fatalf("parked list:\n%s", out)
	}
	var show parkedShowReport
	ctl.json(&show, "parked", "show", fulfillment.Name, poison[0])
	if show.Message.MessageID != poison[0] || show.Inbox == nil || show.Inbox.Status != inbox.StatusPermanentFailed || !strings.Contains(string(show.Body), "order_id") {
		t.Fatalf("parked show: %+v", show)
	}
	if out := ctl.ok("parked", "show", fulfillment.Name, poison[0]); !strings.Contains(out, "parked_reason_code: order_not_found") {
		t.Fatalf("parked show:\n%s", out)
	}
	parked(0, 0)
	var status StatusReport
	ctl.json(&status, "status")
	if !slices.Contains(status.Next, "orderctl parked list fulfillment") ||
		!slices.ContainsFunc(status.Queues, func(q QueueDepth) bool { return q.Queue == "orders.fulfillment.dlq" && q.Messages == 2 }) {
		t.Fatalf("status: %+v", status)
	}

	// A state change needs a reason.
	if _, err := ctl.run("parked", "replay", fulfillment.Name, poison[0]); err == nil || !strings.Contains(err.Error(), "--reason") {
		t.Fatalf("replay without a reason: %v", err)
	}
	if len(ctl.audit()) != 0 {
		t.Fatal("a refused command left an audit row")
	}

	// One message, by id: back to the work queue with its id, where it
	// fails again and is parked again.
	var replayed replayReport
	ctl.json(&replayed, "parked", "replay", fulfillment.Name, poison[0], "--reason", "order table restored")
	if !slices.Equal(replayed.Moved, poison[:1]) {
		t.Fatalf("replay moved %v", replayed.Moved)
	}
	parked(1, 0)
	var row InboxRow
	ctl.json(&row, "inbox", "show", fulfillment.Name, poison[0])
	if row.Attempts != 2 || row.Status != inbox.StatusPermanentFailed || row.LastErrorCode != "order_not_found" {
		t.Fatalf("inbox row after the replay: %+v", row)
	}

	// Every message: each is moved once, however fast the consumer parks
	// them again.
	ctl.json(&replayed, "parked", "replay", fulfillment.Name, "--all", "--reason", "retry after the fix")
	if len(replayed.Moved) != 2 || !slices.Contains(replayed.Moved, poison[0]) || !slices.Contains(replayed.Moved, poison[1]) {
		t.Fatalf("replay --all moved %v, want each of %v once", replayed.Moved, poison)
	}
	parked(2, 1) // both parked again, each replayed once more

	// Discard: gone from the parking lot, kept in the audit.
	var discarded discardReport
	ctl.json(&discarded, "parked", "discard", fulfillment.Name, poison[0], "--reason", "test message, never valid")
	if discarded.Message.MessageID != poison[0] || discarded.Message.ReasonCode != "order_not_found" || !discarded.Forgotten {
		t.Fatalf("discarded %+v (failed inbox row removed: %v)", discarded.Message, discarded.Forgotten)
	}
	if _, err := ctl.run("parked", "discard", fulfillment.Name, poison[0], "--reason", "again"); err == nil {
		t.Fatal("a second discard of the same message: want an error")
	}

	var actions []string
	for _, a := range ctl.audit() {
		if a.Actor != "tester" || a.Reason == "" || len(a.Details) == 0 {
			t.Errorf("audit row %+v", a)
		}
		actions = append(actions, a.Action+" "+a.Target)
	}
	want := []string{"parked.discard fulfillment " + poison[0], "parked.replay fulfillment", "parked.replay fulfillment " + poison[0]}
	if !slices.Equal(actions, want) {
		t.Fatalf("audit, newest first: %v, want %v", actions, want)
	}
	if out := ctl.ok("audit"); !strings.Contains(out, "order table restored") || !strings.Contains(out, "tester") {
		t.Fatalf("audit:\n%s", out)
	}
}

// outbox failed lists the FAILED rows; outbox retry puts them back to
// PENDING with their attempts reset, by id or by type, and records why in
// the same transaction; status points at them.
func TestOutboxRetry(t *testing.T) {
	t.Parallel()
	db := testenv.NewDatabase(t, migrations.Schemas...)
	ctl := newCtl(t, db.URL, testenv.NewVhost(t))
	// A FAILED row: written as a service writes it, claimed, and refused
	// by the broker on its last attempt (one at a time: failed oldest first).
	writer := outbox.Writer{Producer: "test", Exchange: domain.EventsExchange, AggregateType: domain.AggregateOrder}
	failed := func(typ string) uuid.UUID {
		ids, err := writer.Write(t.Context(), db.Pool, messaging.Cause{}, testMessage{typ: typ, aggregateID: uuid.NewString()})
		if err != nil {
			t.Fatal(err)
		}
		refused, err := outboxtest.FailDue(t.Context(), db.Pool, "test", "unroutable: 312 NO_ROUTE")
		if err != nil || len(refused) != 1 || refused[0] != ids[0] {
			t.Fatalf("refused %v, %v", refused, err)
		}
		return ids[0]
	}
	one, two, three := failed(domain.TypeOrderSubmitted), failed(domain.TypeOrderFulfilled), failed(domain.TypeOrderFulfilled)

	var list failedReport
	ctl.json(&list, "outbox", "failed")
	if len(list.Rows) != 3 || list.Rows[0].ID != one || list.Rows[0].LastError != "unroutable: 312 NO_ROUTE" || list.Rows[0].Attempts != 1 {
		t.Fatalf("outbox failed: %+v", list.Rows)
	}
	var status StatusReport
	ctl.json(&status, "status")
	if !slices.ContainsFunc(status.Stuck, func(s Stuck) bool {
		return s.ID == one.String() && strings.HasPrefix(s.Next, "fix what last_error says, then: orderctl outbox retry "+one.String())
	}) || !slices.ContainsFunc(status.Outbox, func(b Backlog) bool { return b.Status == "FAILED" && b.Of == domain.TypeOrderFulfilled && b.Rows == 2 }) {
		t.Fatalf("status: %+v", status)
	}
	if out := ctl.ok("status"); !strings.Contains(out, "orderctl outbox retry "+one.String()) || !strings.Contains(out, "absent") {
		t.Fatalf("status:\n%s", out)
	}

	if _, err := ctl.run("outbox", "retry", one.String()); err == nil || !strings.Contains(err.Error(), "--reason") {
		t.Fatalf("retry without a reason: %v", err)
	}
	var retried retryReport
	ctl.json(&retried, "outbox", "retry", one.String(), "--reason", "binding added")
	if len(retried.Retried) != 1 || retried.Retried[0].ID != one || retried.Audit.ID == 0 {
		t.Fatalf("retry: %+v", retried)
	}
	if after, err := outboxadmin.Aggregate(t.Context(), db.Pool, domain.AggregateOrder, retried.Retried[0].AggregateID); err != nil ||
		len(after) != 1 || after[0].Status != "PENDING" || after[0].Attempts != 0 || after[0].NextAttemptAt.After(time.Now()) {
		t.Fatalf("row after retry: %+v, %v", after, err)
	}
	if _, err := ctl.run("outbox", "retry", one.String(), "--reason", "again"); err == nil {
		t.Fatal("retry of a row that is not FAILED: want an error")
	}
	ctl.json(&retried, "outbox", "retry", "--type", domain.TypeOrderFulfilled, "--reason", "broker disk alarm cleared")
	if ids := []uuid.UUID{retried.Retried[0].ID, retried.Retried[1].ID}; len(retried.Retried) != 2 || !slices.Contains(ids, two) || !slices.Contains(ids, three) {
		t.Fatalf("retry --type: %+v", retried.Retried)
	}

	audit := ctl.audit()
	if len(audit) != 2 || audit[1].Action != "outbox.retry" || audit[1].Target != one.String() || audit[1].Reason != "binding added" ||
		!strings.Contains(string(audit[1].Details), "unroutable: 312 NO_ROUTE") || audit[0].Target != domain.TypeOrderFulfilled {
		t.Fatalf("audit: %+v", audit)
	}
}

// testMessage is a message of any type, with an empty body.
type testMessage struct{ typ, aggregateID string }

func (m testMessage) MessageType() string { return m.typ }
func (m testMessage) MessageVersion() int { return 1 }
func (m testMessage) AggregateID() string { return m.aggregateID }

// order <id> shows an order that went through the whole flow (a relay and
// every consumer), with a parked message about it and its trace id.
func TestOrderTimeline(t *testing.T) {
	t.Parallel()
	h := consumertest.Start(t, consumer.All(consumer.Deps{MeterProvider: metricnoop.NewMeterProvider()})...)
	dbURL := h.Pool.Config().ConnString()
	ctl := newCtl(t, dbURL, h.AMQPURL)

	// The order and its order.submitted row, as the API writes them, with
	// the trace context of its request.
	o, err := domain.NewOrder(uuid.Must(uuid.NewV7()), "c-1", "EUR", []domain.Item{{SKU: "A-1", Quantity: 1, UnitPriceCents: 100}})
	if err != nil {
		t.Fatal(err)
	}
	err = pgx.BeginFunc(t.Context(), h.Pool, func(tx pgx.Tx) error {
		created, err := store.CreateOrder(t.Context(), tx, o, domain.Cause{CorrelationID: "corr-ctl"})
		if err != nil {
			return err
		}
		_, err = store.OutboxWriter("test").Write(t.Context(), tx, messaging.Cause{CorrelationID: "corr-ctl"}, domain.SubmittedMessage(created))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	if _, err := h.Pool.Exec(t.Context(), `UPDATE message_outbox SET headers = headers || jsonb_build_object('traceparent', $1::text)`,
		"00-"+traceID+"-00f067aa0ba902b7-01"); err != nil {
		t.Fatal(err)
	}
	startRelay(t, dbURL, h.AMQPURL)
	testenv.WaitFor(t, 20*time.Second, "the order to be FULFILLED", func() bool {
		var s string
		return h.Pool.QueryRow(t.Context(), `SELECT status FROM orders WHERE order_id = $1`, o.ID()).Scan(&s) == nil && s == string(domain.StatusFulfilled)
	})

	// A broken message about the order, parked by the consumers that read
	// its type.
	badID := uuid.NewString()
	publish(t, h.AMQPURL, amqp.Publishing{MessageId: badID, Type: domain.TypeOrderSubmitted, ContentType: messaging.ContentTypeJSON,
		Headers: amqp.Table{messaging.HeaderMessageVersion: int32(1)}, Body: []byte(`{"order_id": "` + o.ID().String() + `", "items": 7}`)})
	h.WaitDone(fulfillment.Name, badID)

	var tl OrderTimeline
	testenv.WaitFor(t, 15*time.Second, "the parked message in the timeline", func() bool {
		ctl.json(&tl, "order", o.ID().String())
		return slices.ContainsFunc(tl.Parked, func(p ParkedOf) bool { return p.Consumer == fulfillment.Name && p.MessageID == badID })
	})
	if tl.Status != string(domain.StatusFulfilled) || len(tl.History) != 3 || tl.History[2].To != string(domain.StatusFulfilled) {
		t.Fatalf("order %s, history %+v", tl.Status, tl.History)
	}
	var types []string
	for _, x := range tl.Outbox {
		if x.Status != "PUBLISHED" || x.PublishedAt == nil || x.Attempts != 1 || x.CorrelationID != "corr-ctl" {
			t.Errorf("outbox row %+v", x)
		}
		types = append(types, x.Type)
	}
	if want := []string{domain.TypeOrderSubmitted, domain.TypeFulfillmentRequested, domain.TypeFulfillmentCompleted, domain.TypeOrderFulfilled}; !slices.Equal(types, want) {
		t.Fatalf("outbox rows %v, want %v", types, want)
	}
	consumers := map[string]bool{}
	for _, x := range tl.Inbox {
		if x.Status != inbox.StatusProcessed || x.ProcessedAt == nil {
			t.Errorf("inbox row %+v", x)
		}
		consumers[x.Consumer] = true
	}
	for _, name := range []string{"fulfillment", "warehouse", "notification", "shipping"} {
		if !consumers[name] {
			t.Errorf("no inbox row of %s in %+v", name, tl.Inbox)
		}
	}
	if !slices.Contains(tl.TraceIDs, traceID) || len(tl.Events) < len(tl.History)+2*len(tl.Outbox)+len(tl.Inbox)+len(tl.Parked) {
		t.Fatalf("trace ids %v, %d events", tl.TraceIDs, len(tl.Events))
	}
	out := ctl.ok("order", o.ID().String())
	for _, want := range []string{"FULFILLED", "order.submitted published (attempt 1)", "fulfillment.requested processed: APPLIED", "trace id: " + traceID, badID, "schema_violation"} {
		if !strings.Contains(out, want) {
			t.Errorf("order lacks %q:\n%s", want, out)
		}
	}
	if _, err := ctl.run("order", uuid.NewString()); err == nil {
		t.Fatal("an order that does not exist: want an error")
	}

	// A rejected order says why, and names the sku: in its status line,
	// its timeline and its history.
	oos, err := domain.NewOrder(uuid.Must(uuid.NewV7()), "c-1", "EUR", []domain.Item{{SKU: "OOS-7", Quantity: 1, UnitPriceCents: 100}})
	if err != nil {
		t.Fatal(err)
	}
	err = pgx.BeginFunc(t.Context(), h.Pool, func(tx pgx.Tx) error {
		created, err := store.CreateOrder(t.Context(), tx, oos, domain.Cause{CorrelationID: "corr-oos"})
		if err != nil {
			return err
		}
		_, err = store.OutboxWriter("test").Write(t.Context(), tx, messaging.Cause{CorrelationID: "corr-oos"}, domain.SubmittedMessage(created))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 20*time.Second, "the order to be REJECTED", func() bool {
		var s string
		return h.Pool.QueryRow(t.Context(), `SELECT status FROM orders WHERE order_id = $1`, oos.ID()).Scan(&s) == nil && s == string(domain.StatusRejected)
	})
	out = ctl.ok("order", oos.ID().String())
	for _, want := range []string{": REJECTED, out of stock: OOS-7 (customer c-1", "FULFILLMENT_REQUESTED -> REJECTED (by message "} {
		if !strings.Contains(out, want) {
			t.Errorf("the rejected order lacks %q:\n%s", want, out)
		}
	}
	var rejected OrderTimeline
	ctl.json(&rejected, "order", oos.ID().String())
	if n := len(rejected.History); n != 3 || rejected.History[n-1].Reason != "out of stock: OOS-7" {
		t.Errorf("history %+v: want the rejection's reason naming OOS-7", rejected.History)
	}
}

// retention deletes what the retention settings allow, with the functions
// the services use, and records that it ran: the outbox's time partitions
// whose rows were all published past RELAY_RETENTION, not one that holds
// a FAILED row, which status names.
func TestRetention(t *testing.T) {
	t.Parallel()
	db := testenv.NewDatabase(t, migrations.Schemas...)
	ctl := newCtl(t, db.URL, testenv.NewVhost(t))
	monday := time.Now().UTC().Truncate(24 * time.Hour)
	monday = monday.AddDate(0, 0, -((int(monday.Weekday()) + 6) % 7))
	outboxtest.TimePartitionsFrom(t, db.Pool, monday.AddDate(0, 0, -28))
	if err := inboxtest.TimePartitionsFrom(t.Context(), db.Pool, monday.AddDate(0, 0, -56)); err != nil {
		t.Fatal(err)
	}
	_, err := db.Pool.Exec(t.Context(), `
		INSERT INTO message_outbox (outbox_id, aggregate_type, aggregate_id, message_type, message_version, exchange_name, routing_key, payload, status, published_at, created_at)
		VALUES (gen_random_uuid(), 'order', 'o-1', 'order.submitted', 1, 'orders.events', 'order.submitted', '{}', 'PUBLISHED', now() - interval '15 days', now() - interval '15 days'),
		       (gen_random_uuid(), 'order', 'o-2', 'order.submitted', 1, 'orders.events', 'order.submitted', '{}', 'PUBLISHED', now(), now()),
		       (gen_random_uuid(), 'order', 'o-3', 'order.submitted', 1, 'orders.events', 'order.submitted', '{}', 'FAILED', NULL, now() - interval '22 days');
		INSERT INTO message_inbox (consumer_name, message_id, message_type, message_version, status, payload_hash, processed_at, first_received_at)
		VALUES ('fulfillment', 'm-old', 'order.submitted', 1, 'PROCESSED', 'h', now() - interval '40 days', now() - interval '40 days'),
		       ('fulfillment', 'm-new', 'order.submitted', 1, 'PROCESSED', 'h', now(), now())`)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ctl.run("retention"); err == nil {
		t.Fatal("retention without a reason: want an error")
	}
	var r retentionReport
	ctl.json(&r, "retention", "--reason", "disk at 90%")
	if len(r.Sweeps) != 3 || r.Sweeps[0].Deleted < 2 || r.Sweeps[0].Waiting != 1 || r.Sweeps[1].Deleted < 2 || r.Sweeps[1].Waiting != 0 || r.Sweeps[2].Deleted != 0 || r.Audit.Action != "retention" {
		t.Fatalf("retention: %+v", r)
	}
	var left string
	if err := db.Pool.QueryRow(t.Context(), `SELECT (SELECT string_agg(aggregate_id, ',' ORDER BY aggregate_id) FROM message_outbox) || ' ' ||
		(SELECT string_agg(message_id, ',') FROM message_inbox)`).Scan(&left); err != nil || left != "o-2,o-3 m-new" {
		t.Fatalf("rows left: %q, %v; want o-2,o-3 m-new", left, err)
	}
	var status StatusReport
	ctl.json(&status, "status")
	if w := status.OutboxPartitions.Waiting; len(w) != 1 || w[0].HeldRows != 1 || status.OutboxPartitions.Ends.Before(time.Now().AddDate(0, 0, 21)) {
		t.Fatalf("status of the time partitions: %+v", status.OutboxPartitions)
	}
	if status.InboxPartitions.Count == 0 || len(status.InboxPartitions.Waiting) != 0 {
		t.Fatalf("status of the inbox's time partitions: %+v", status.InboxPartitions)
	}
	if out := ctl.ok("status"); !strings.Contains(out, "retention waits for 1 rows") {
		t.Fatalf("status:\n%s", out)
	}
}

// Commands and arguments that make no sense are refused before anything
// runs; -h prints the usage.
func TestUsage(t *testing.T) {
	t.Parallel()
	ctl := newCtl(t, "postgres://nobody@127.0.0.1:1/none", "amqp://127.0.0.1:1/")
	for _, args := range [][]string{nil, {"frobnicate"}, {"outbox"}, {"parked", "list"}, {"parked", "list", "nobody"}, {"order"},
		{"parked", "replay", "fulfillment", "--all"}, {"retention", "now", "--reason", "r"}, {"--limit", "-1", "audit"}} {
		if _, err := ctl.run(args...); err == nil {
			t.Errorf("orderctl %v: want an error", args)
		}
	}
	var stderr bytes.Buffer
	_ = run(t.Context(), []string{"-h"}, ctl.environ, io.Discard, &stderr)
	for _, c := range commands {
		if !strings.Contains(stderr.String(), c.name+" "+c.usage) {
			t.Errorf("the usage lacks %q", c.name)
		}
	}
}

// Under compose, orderctl starts nothing (docker-compose.yml): run before
// the stack's `up`, its secret files are not there yet, and it says what
// to run first.
func TestMissingSecretFileSaysToStartTheStack(t *testing.T) {
	t.Parallel()
	ctl := newCtl(t, "postgres://nobody@127.0.0.1:1/none", "amqp://127.0.0.1:1/")
	ctl.environ["DATABASE_PASSWORD_FILE"] = filepath.Join(t.TempDir(), "db-orders_operator")
	err := run(t.Context(), []string{"status"}, ctl.environ, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "DATABASE_PASSWORD_FILE") || !strings.Contains(err.Error(), "docker compose up -d --wait") {
		t.Errorf("orderctl status without its password file: %v; want the variable named and the stack's start", err)
	}
}

// orderctl pointed at a role the server does not have (a login the
// server refuses for good, like a wrong password) stops at once and says
// why, although DB_CONNECT_TIMEOUT would let it wait an hour for a server
// that is starting.
func TestRefusedLoginFailsAtOnce(t *testing.T) {
	t.Parallel()
	role := "no_such_operator_" + strings.ReplaceAll(uuid.NewString(), "-", "")
	ctl := newCtl(t, "postgres://nobody@127.0.0.1:1/none", "amqp://127.0.0.1:1/")
	ctl.environ["DATABASE_URL"] = testenv.AsRole(testenv.ServerURL(t, "postgres"), role) // not newCtl's orders_operator
	ctl.environ["DB_CONNECT_TIMEOUT"] = "1h"
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	err := run(ctx, []string{"status"}, ctl.environ, io.Discard, io.Discard)
	if err == nil {
		t.Fatal("orderctl status connected as a role that does not exist")
	}
	if msg := err.Error(); !strings.Contains(msg, "not retried") || !strings.Contains(msg, "28000") || !strings.Contains(msg, role) {
		t.Errorf("orderctl status: %v; want the refusal, its SQLSTATE and the role named", err)
	}
	if ctx.Err() != nil {
		t.Errorf("orderctl status waited until the test's deadline: %v", err)
	}
}

// Every variable orderctl reads is documented on the configuration page.
func TestConfigurationPageDocumentsEveryVariable(t *testing.T) {
	t.Parallel()
	testenv.ConfigurationDocuments(t, config.Variables(&Config{}))
}

// The compose files' orderctl service (docker compose run --rm orderctl
// ...) sets only variables orderctl reads.
func TestComposeSetsOnlyWhatOrderctlReads(t *testing.T) {
	t.Parallel()
	testenv.ComposeSetsOnly(t, "orderctl", config.Variables(&Config{}))
}

func startRelay(t *testing.T, dbURL, amqpURL string) {
	t.Helper()
	pool, err := database.NewPool(t.Context(), database.PoolConfig{URL: dbURL, AppName: "relay-under-test"})
	if err != nil {
		t.Fatal(err)
	}
	r, err := outbox.NewRelay(outbox.Config{PollInterval: 50 * time.Millisecond, BackoffBase: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond},
		messaging.Deps{Pool: pool, AMQPURL: amqpURL, Logger: testenv.Logger(), MeterProvider: metricnoop.NewMeterProvider(), TracerProvider: tracenoop.NewTracerProvider()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done; pool.Close() })
	testenv.WaitFor(t, 10*time.Second, "the relay to be ready", func() bool { return r.Ready(t.Context()) == nil })
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

// `orderctl token` prints a token that order-api's verifier accepts, for
// the customer or operator asked for, with the API's issuer and audience,
// and needs no database (the one here answers nowhere).
func TestToken(t *testing.T) {
	t.Parallel()
	ctl := newCtl(t, "postgres://nobody@127.0.0.1:1/none", "amqp://127.0.0.1:1/")
	secret := "0123456789abcdef0123456789abcdef-test"
	ctl.environ["API_JWT_SECRET"] = secret
	ctl.environ["API_JWT_ISSUER"] = "orders-dev"
	ctl.environ["API_JWT_AUDIENCE"] = "order-api"
	verifier, err := auth.NewVerifier(auth.Options{Secret: []byte(secret), Issuer: "orders-dev", Audience: "order-api"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want auth.Principal
	}{
		{[]string{"token", "-customer", "c-1"}, auth.Principal{Subject: "c-1", Role: auth.RoleCustomer}},
		// An operator's sub says it is a development operator token, and
		// whose (ORDERCTL_USER).
		{[]string{"token", "-operator", "-ttl", "5m"}, auth.Principal{Subject: "dev-operator:tester", Role: auth.RoleOperator}},
	} {
		out := ctl.ok(tc.args...)
		if strings.Count(out, "\n") != 1 {
			t.Errorf("orderctl %v printed more than the token:\n%s", tc.args, out)
		}
		p, err := verifier.Verify(strings.TrimSpace(out))
		if err != nil || p != tc.want {
			t.Errorf("orderctl %v: the token verifies as %+v, %v; want %+v", tc.args, p, err, tc.want)
		}
	}
	var r tokenReport
	ctl.json(&r, "token", "-customer", "c-2", "-ttl", "10m")
	if p, err := verifier.Verify(r.Token); err != nil || p.Subject != "c-2" || r.Role != auth.RoleCustomer ||
		time.Until(r.ExpiresAt) > 10*time.Minute || time.Until(r.ExpiresAt) < 9*time.Minute {
		t.Errorf("--json: %+v (%v)", r, err)
	}
	for _, args := range [][]string{{"token"}, {"token", "-customer", "c", "-operator"}, {"token", "-operator", "-ttl", "0s"}} {
		if _, err := ctl.run(args...); err == nil {
			t.Errorf("orderctl %v: want an error", args)
		}
	}
	delete(ctl.environ, "API_JWT_SECRET")
	if _, err := ctl.run("token", "-operator"); err == nil || !strings.Contains(err.Error(), "API_JWT_SECRET") {
		t.Errorf("without API_JWT_SECRET: %v, want it named", err)
	}
}

// The timeline lists what happened in the order it happened, though the
// relay records published_at when the broker confirms, which may be after
// the consumer's transaction has begun (a few microseconds, printed as the
// same millisecond), and though one transaction stamps all its rows with
// one now().
func TestTimelineInCausalOrder(t *testing.T) {
	t.Parallel()
	submitted, requested := uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())
	t0 := time.Date(2026, 12, 5, 13, 0, 0, 0, time.UTC)
	processed := t0.Add(40 * time.Millisecond)
	published := processed.Add(300 * time.Microsecond) // confirmed after the consumer began
	for _, tc := range []struct {
		name      string
		published time.Time
	}{{"published recorded late", published}, {"published at the same instant", processed}} {
		tl := &OrderTimeline{
			History: []Transition{
				{From: "", To: "PENDING", At: t0},
				{From: "PENDING", To: "ACCEPTED", MessageID: submitted.String(), At: processed},
			},
			Outbox: []outboxadmin.Message{
				{ID: submitted, Type: "order.submitted", Status: "PUBLISHED", Attempts: 1, CreatedAt: t0, PublishedAt: &tc.published},
				{ID: requested, Type: "fulfillment.requested", Status: "PENDING", CreatedAt: processed, UpdatedAt: processed},
			},
			Inbox: []inboxadmin.Row{
				{Consumer: "fulfillment", MessageID: submitted.String(), Type: "order.submitted", Status: inbox.StatusProcessed,
					Outcome: "APPLIED", Attempts: 1, FirstReceivedAt: processed, LastReceivedAt: processed, ProcessedAt: &processed},
			},
		}
		tl.events()
		var got []string
		for _, e := range tl.Events {
			got = append(got, e.Who+": "+strings.Fields(e.What)[0]+" "+strings.Fields(e.What)[1])
		}
		want := []string{
			"order: (new) ->",
			"outbox: order.submitted written,",
			"relay: order.submitted published",
			"order: PENDING ->",
			"fulfillment: order.submitted processed:",
			"outbox: fulfillment.requested written,",
			"relay: fulfillment.requested PENDING,",
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s: the timeline reads\n  %s\nwant\n  %s", tc.name, strings.Join(got, "\n  "), strings.Join(want, "\n  "))
		}
		if !tl.Events[2].At.Equal(tc.published) {
			t.Errorf("%s: the publish is shown at %v, not when the relay recorded it (%v)", tc.name, tl.Events[2].At, tc.published)
		}
	}
}

// status shows both message tables' figures and what holds the
// transaction horizon: here order-api's session, idle in a transaction,
// which orders_operator sees by name and state.
func TestStatusShowsTablesAndHorizon(t *testing.T) {
	t.Parallel()
	db := testenv.NewDatabase(t, migrations.Schemas...)
	ctl := newCtl(t, db.URL, testenv.NewVhost(t))
	cfg, err := pgx.ParseConfig(db.URLAs(migrations.RoleAPI))
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["application_name"] = "held-by-test"
	holder, err := pgx.ConnectConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close(context.Background())
	tx, err := holder.BeginTx(t.Context(), pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := tx.Exec(t.Context(), "SELECT count(*) FROM orders"); err != nil {
		t.Fatal(err)
	}

	var status StatusReport
	ctl.json(&status, "status")
	var tables []string
	for _, s := range status.Tables {
		tables = append(tables, s.Table)
		if s.IndexBytes == 0 {
			t.Errorf("status: %s has no index bytes: %+v", s.Table, s)
		}
	}
	if !slices.Equal(tables, []string{"message_outbox", "message_inbox"}) {
		t.Errorf("status tables %q, want message_outbox and message_inbox", tables)
	}
	if len(status.Horizon) == 0 || status.Horizon[0].Kind != "session" || status.Horizon[0].Name != "held-by-test" ||
		status.Horizon[0].State != "idle in transaction" {
		t.Errorf("status horizon %+v; want the session held-by-test first, idle in transaction", status.Horizon)
	}
	if out := ctl.ok("status"); !strings.Contains(out, "session held-by-test (pid ") || !strings.Contains(out, "message_inbox") {
		t.Errorf("status:\n%s", out)
	}
}

// status reads the queues order-consumer declares with the same
// MESSAGE_PARTITIONS: a work queue per partition and no retry queues
// (a partition's consumer retries in place), not the one work queue and
// retry queues of MESSAGE_PARTITIONS=0, which would all read absent.
func TestStatusFindsThePartitionQueues(t *testing.T) {
	t.Parallel()
	db := testenv.NewDatabase(t, migrations.Schemas...)
	vhost := testenv.NewVhost(t)
	conn, err := amqp.Dial(vhost)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	topology := inbox.Topology{Consumer: fulfillment.Name, Exchange: domain.EventsExchange, DeliveryLimit: 5, Partitions: 2}
	if err := topology.Declare(ch); err != nil {
		t.Fatal(err)
	}
	ctl := newCtl(t, db.URL, vhost)
	ctl.environ["MESSAGE_PARTITIONS"] = "2"

	var status StatusReport
	ctl.json(&status, "status")
	var got []string
	for _, q := range status.Queues {
		if q.Consumer != fulfillment.Name {
			continue
		}
		if q.Missing {
			t.Errorf("status: %s (%s) absent", q.Queue, q.Kind)
		}
		got = append(got, q.Kind+" "+q.Queue)
	}
	want := []string{"work orders.fulfillment.p0", "work orders.fulfillment.p1", "parking lot orders.fulfillment.dlq"}
	if !slices.Equal(got, want) || status.QueueNote != "" {
		t.Errorf("status: fulfillment's queues %q (note %q), want %q", got, status.QueueNote, want)
	}
}
