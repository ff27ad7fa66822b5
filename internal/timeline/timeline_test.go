package timeline_test

import (
	"errors"
	"maps"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/domain"
	"github.com/yourorg/orders/internal/messaging"
	"github.com/yourorg/orders/internal/messaging/inbox/inboxadmin"
	"github.com/yourorg/orders/internal/messaging/inbox/inboxtest"
	"github.com/yourorg/orders/internal/messaging/outbox"
	"github.com/yourorg/orders/internal/messaging/outbox/outboxadmin"
	"github.com/yourorg/orders/internal/messaging/outbox/outboxtest"
	"github.com/yourorg/orders/internal/store"
	"github.com/yourorg/orders/internal/testenv"
	"github.com/yourorg/orders/internal/timeline"
	"github.com/yourorg/orders/migrations"
)

func TestMain(m *testing.M) {
	// As telemetry.Setup does in each binary: the outbox rows carry the
	// W3C trace context of the transaction that writes them.
	otel.SetTextMapPropagator(propagation.TraceContext{})
	os.Exit(m.Run())
}

// The trace of the request that created the order, as the API's outbox
// row carries it.
var requestTrace = trace.NewSpanContext(trace.SpanContextConfig{
	TraceID:    trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36},
	SpanID:     trace.SpanID{0, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7},
	TraceFlags: trace.FlagsSampled,
})

// apiPool connects to db as order-api's role, orders_api, which reads the
// outbox and the inbox only through the timeline's functions.
func apiPool(t *testing.T, db *testenv.Database) *pgxpool.Pool {
	t.Helper()
	pool, err := database.NewPool(t.Context(), database.PoolConfig{URL: db.URLAs(migrations.RoleAPI)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// readTimeline reads the timeline as the page does: as order-api's role,
// in one read-only transaction.
func readTimeline(t *testing.T, db *testenv.Database, id uuid.UUID) *timeline.Timeline {
	t.Helper()
	var tl *timeline.Timeline
	err := pgx.BeginTxFunc(t.Context(), apiPool(t, db), pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		var err error
		tl, err = timeline.Read(t.Context(), tx, id)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return tl
}

// An order written, published, consumed, notified and cancelled, row by
// row with the functions the services use: its timeline has every hop, in
// the order they happened, with the facts of each.
func TestTimelineHasEveryHopInTimeOrder(t *testing.T) {
	t.Parallel()
	db := testenv.NewDatabase(t, migrations.Schemas...)
	ctx := t.Context()
	pool := db.Pool

	// order-api: the order and its order.submitted row, in the request's trace.
	order, err := domain.NewOrder(uuid.Must(uuid.NewV7()), "c-<b>1</b>", "EUR", []domain.Item{{SKU: "A-1", Quantity: 2, UnitPriceCents: 1250}})
	if err != nil {
		t.Fatal(err)
	}
	api := store.OutboxWriter("order-api")
	var submitted uuid.UUID
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		cause := domain.Cause{CorrelationID: "corr-1"}
		created, err := store.CreateOrder(ctx, tx, order, cause)
		if err != nil {
			return err
		}
		traced := trace.ContextWithSpanContext(ctx, requestTrace)
		ids, err := api.Write(traced, tx, messaging.Cause(cause), domain.SubmittedMessage(created))
		if err != nil {
			return err
		}
		submitted = ids[0]
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	// outbox-relay: claims and publishes it.
	if ids, err := outboxtest.PublishDue(ctx, pool, "relay-1"); err != nil || len(ids) != 1 {
		t.Fatalf("publish: %v, %d rows", err, len(ids))
	}

	// fulfillment applies it: inbox row, transition, follow-up message.
	entry := inboxtest.Message{Consumer: "fulfillment", MessageID: submitted.String(), Type: domain.TypeOrderSubmitted, Version: 1,
		AggregateID: order.ID().String(), CorrelationID: "corr-1", TraceID: requestTrace.TraceID().String()}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		cause := domain.Cause{MessageID: submitted.String(), CorrelationID: "corr-1"}
		if _, _, err := store.MoveOrder(ctx, tx, order.ID(), domain.TriggerSubmitted, cause); err != nil {
			return err
		}
		return inboxtest.Applied(ctx, tx, entry)
	})
	if err != nil {
		t.Fatal(err)
	}
	// Another consumer failed on it and will retry.
	failed := entry
	failed.Consumer = "warehouse"
	if err := inboxtest.Failed(ctx, pool, failed, "lock_timeout", "the stock row was locked"); err != nil {
		t.Fatal(err)
	}
	// The notifier applied it too, after its webhook call: a second
	// consumer that applied the message, but not the one that moved the
	// order (the page used to say "a consumer" for that transition).
	notified := entry
	notified.Consumer = "notification"
	if err := inboxtest.Applied(ctx, pool, notified); err != nil {
		t.Fatal(err)
	}

	// The notifier recorded a notification and sent it on its second call.
	if _, err := pool.Exec(ctx, `
		INSERT INTO customer_notification (notification_id, order_id, kind, status, message_id, attempt_count, last_error, sent_at)
		VALUES ($1, $2, 'order_received', 'SENT', $3, 2, 'webhook answered 503', now())`,
		uuid.New(), order.ID(), submitted.String()); err != nil {
		t.Fatal(err)
	}

	// order-api: the cancel, whose message is not published yet.
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		cause := domain.Cause{CorrelationID: "corr-2"}
		if _, _, err := store.MoveOrder(ctx, tx, order.ID(), domain.TriggerCancel, cause); err != nil {
			return err
		}
		_, err := api.Write(ctx, tx, messaging.Cause(cause), domain.OrderCancelledV1{ID: order.ID()})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}

	// Rows that are not this order's: another aggregate's message with the
	// same id, and a consumer's row of another order.
	customers := outbox.Writer{Producer: "test", Exchange: "orders", AggregateType: "customer"}
	if _, err := customers.Write(ctx, pool, messaging.Cause{}, customerUpdated{order.ID().String()}); err != nil {
		t.Fatal(err)
	}
	other := entry
	other.MessageID, other.AggregateID = uuid.NewString(), uuid.NewString()
	if err := inboxtest.Failed(ctx, pool, other, "x", "another order"); err != nil {
		t.Fatal(err)
	}

	tl := readTimeline(t, db, order.ID())
	if tl.Order.Status() != domain.StatusCancelled || len(tl.History) != 3 || len(tl.Outbox) != 2 || len(tl.Inbox) != 3 || len(tl.Notifications) != 1 {
		t.Fatalf("timeline: %s, %d transitions, %d outbox, %d inbox, %d notifications",
			tl.Order.Status(), len(tl.History), len(tl.Outbox), len(tl.Inbox), len(tl.Notifications))
	}
	if got, want := tl.TraceID(), "4bf92f3577b34da6a3ce929d0e0e4736"; got != want {
		t.Errorf("TraceID() = %q, want %q", got, want)
	}

	type hop struct {
		actor   string
		kind    timeline.Kind
		summary string
		health  timeline.Health
	}
	var got []hop
	for _, h := range tl.Hops() {
		got = append(got, hop{h.Actor, h.Kind, h.Summary, h.Health})
	}
	want := []hop{
		{"order-api", timeline.KindTransition, "order created: SUBMITTED", timeline.HealthOK},
		{"outbox-relay", timeline.KindPublish, "published order.submitted", timeline.HealthOK},
		{"fulfillment", timeline.KindDelivery, "order.submitted: PROCESSED (APPLIED)", timeline.HealthOK},
		{"fulfillment", timeline.KindTransition, "SUBMITTED → FULFILLMENT_REQUESTED on order.submitted", timeline.HealthOK},
		{"warehouse", timeline.KindDelivery, "order.submitted: RETRYABLE_FAILED", timeline.HealthPending},
		{"notification", timeline.KindDelivery, "order.submitted: PROCESSED (APPLIED)", timeline.HealthOK},
		{"webhook", timeline.KindNotification, "notification order_received: SENT", timeline.HealthOK},
		{"order-api", timeline.KindTransition, "FULFILLMENT_REQUESTED → CANCELLED (HTTP request)", timeline.HealthOK},
		// Waiting: after everything that happened.
		{"outbox-relay", timeline.KindPublish, "order.cancelled not published yet: PENDING", timeline.HealthPending},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("hops:\n got %v\nwant %v", got, want)
	}

	hops := tl.Hops()
	if !slices.IsSortedFunc(hops[:8], func(a, b timeline.Hop) int { return a.At.Compare(b.At) }) || !hops[8].Waiting {
		t.Errorf("hops are not in time order, the waiting one last")
	}
	facts := func(h timeline.Hop) string {
		var b strings.Builder
		for _, d := range h.Details {
			b.WriteString(d.Label + "=" + d.Value + "; ")
		}
		return b.String()
	}
	for i, want := range map[int][]string{
		1: {"message id=" + submitted.String(), "written by=order-api", "attempts=1", "marked published at="},
		4: {"attempts=1", "last error=lock_timeout: the stock row was locked", "processed=not yet"},
		6: {"webhook calls=2", "last error=webhook answered 503"},
		7: {"correlation id=corr-2"},
		8: {"written by=order-api", "next attempt at="},
	} {
		for _, w := range want {
			if !strings.Contains(facts(hops[i]), w) {
				t.Errorf("hop %d (%s) has no %q: %s", i, hops[i].Summary, w, facts(hops[i]))
			}
		}
	}
}

// A transition made on a message is labelled like every consumer's hop, by
// the consumer's name: of the consumers that applied the message, those
// whose transaction had started by the transition's time.
func TestTransitionIsLabelledByItsConsumer(t *testing.T) {
	t.Parallel()
	msg := uuid.NewString()
	t0 := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	at := func(d time.Duration) *time.Time { v := t0.Add(d); return &v }
	applied := func(consumer string, processed *time.Time) inboxadmin.Row {
		return inboxadmin.Row{Consumer: consumer, MessageID: msg, Type: domain.TypeOrderSubmitted, Status: "PROCESSED",
			Outcome: "APPLIED", FirstReceivedAt: t0.Add(-time.Second), ProcessedAt: processed}
	}
	for _, tc := range []struct {
		name  string
		inbox []inboxadmin.Row
		want  string
	}{
		{"one consumer applied it", []inboxadmin.Row{applied("fulfillment", at(-time.Millisecond))}, "fulfillment"},
		{"another applied it after the transition", []inboxadmin.Row{applied("fulfillment", at(-time.Millisecond)), applied("notification", at(time.Second))}, "fulfillment"},
		{"the transaction started at the transition's time", []inboxadmin.Row{applied("notification", at(time.Millisecond)), applied("fulfillment", at(0))}, "fulfillment"},
		{"two applied it before: either may have", []inboxadmin.Row{applied("notification", at(-time.Second)), applied("fulfillment", at(-time.Millisecond))}, "notification or fulfillment"},
		{"a failed delivery is no candidate", []inboxadmin.Row{applied("fulfillment", at(-time.Millisecond)), {Consumer: "warehouse", MessageID: msg, Status: "RETRYABLE_FAILED", FirstReceivedAt: t0.Add(-time.Second)}}, "fulfillment"},
		{"the inbox rows deleted by retention", nil, timeline.ActorConsumer},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tl := timeline.Timeline{
				History: []store.HistoryEntry{{From: domain.StatusSubmitted, To: domain.StatusFulfillmentRequested, MessageID: &msg, CreatedAt: t0}},
				Inbox:   tc.inbox,
			}
			for _, h := range tl.Hops() {
				if h.Kind == timeline.KindTransition && h.Actor != tc.want {
					t.Errorf("the transition's actor is %q, want %q", h.Actor, tc.want)
				}
			}
		})
	}
}

// A rejected order's timeline says why on the rejection's hop: the
// reason the consumer recorded with the move, read as order-api's role.
func TestRejectionHopSaysWhy(t *testing.T) {
	t.Parallel()
	db := testenv.NewDatabase(t, migrations.Schemas...)
	ctx := t.Context()
	order, err := domain.NewOrder(uuid.Must(uuid.NewV7()), "c-1", "EUR", []domain.Item{{SKU: "OOS-1", Quantity: 1, UnitPriceCents: 100}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.CreateOrder(ctx, db.Pool, order, domain.Cause{CorrelationID: "corr-1"}); err != nil {
		t.Fatal(err)
	}
	for _, step := range []struct {
		trigger domain.Trigger
		reason  string
	}{{domain.TriggerSubmitted, ""}, {domain.TriggerFulfillmentRejected, "out of stock: OOS-1"}} {
		cause := domain.Cause{MessageID: uuid.NewString(), CorrelationID: "corr-1"}
		if _, _, err := store.MoveOrderBecause(ctx, db.Pool, order.ID(), step.trigger, cause, step.reason); err != nil {
			t.Fatal(err)
		}
	}
	var rejection *timeline.Hop
	for _, h := range readTimeline(t, db, order.ID()).Hops() {
		if h.Kind == timeline.KindTransition && strings.Contains(h.Summary, "→ REJECTED") {
			rejection = &h
		}
	}
	if rejection == nil || !strings.HasSuffix(rejection.Summary, ": out of stock: OOS-1") ||
		!slices.Contains(rejection.Details, timeline.Detail{Label: "reason", Value: "out of stock: OOS-1"}) {
		t.Fatalf("the rejection's hop %+v: want its summary and its facts to say out of stock: OOS-1", rejection)
	}
}

// The journey in a few facts: the statuses, the time from the creation to
// the last change and its reason, the rows of each kind, the hops by
// health. A row that went through after failing says so (Retried), and
// counts as retried; one that failed or still waits does not; a transition
// names the status it moved to.
func TestSummaryAndRetries(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	ptr := func(v time.Time) *time.Time { return &v }
	msg := uuid.NewString()
	tl := timeline.Timeline{
		History: []store.HistoryEntry{
			{To: domain.StatusSubmitted, CreatedAt: t0},
			{From: domain.StatusSubmitted, To: domain.StatusFulfillmentRequested, MessageID: &msg, CreatedAt: at(40 * time.Millisecond)},
			{From: domain.StatusFulfillmentRequested, To: domain.StatusRejected, MessageID: &msg, Reason: "out of stock: OOS-1", CreatedAt: at(1250 * time.Millisecond)},
		},
		Outbox: []outboxadmin.Message{
			{ID: uuid.New(), Type: "order.submitted", Status: "PUBLISHED", Attempts: 3, LastError: "returned: NO_ROUTE", PublishedAt: ptr(at(time.Millisecond))},
			{ID: uuid.New(), Type: "order.rejected", Status: "PUBLISHED", Attempts: 1, PublishedAt: ptr(at(2 * time.Second))},
		},
		Inbox: []inboxadmin.Row{
			{Consumer: "notification", MessageID: msg, Type: "order.submitted", Status: "PROCESSED", Outcome: "APPLIED", Attempts: 2,
				LastErrorCode: "webhook_unavailable", LastErrorMessage: "webhook answered 503", FirstReceivedAt: at(time.Millisecond), ProcessedAt: ptr(at(time.Second))},
			{Consumer: "warehouse", MessageID: msg, Type: "order.submitted", Status: "RETRYABLE_FAILED", Attempts: 2,
				LastErrorCode: "lock_timeout", FirstReceivedAt: at(time.Millisecond)},
			{Consumer: "shipping", MessageID: msg, Type: "order.submitted", Status: "POISONED", Attempts: 5,
				LastErrorCode: "transient", FirstReceivedAt: at(time.Millisecond)},
		},
		Notifications: []timeline.Notification{
			{ID: uuid.New(), Kind: "order_received", Status: "SENT", Attempts: 2, CreatedAt: at(time.Millisecond), SentAt: ptr(at(time.Second))},
			{ID: uuid.New(), Kind: "order_rejected", Status: "SENT", Attempts: 1, CreatedAt: at(2 * time.Second), SentAt: ptr(at(2 * time.Second))},
			{ID: uuid.New(), Kind: "order_other", Status: "FAILED", Attempts: 3, LastError: "webhook answered 404", CreatedAt: at(2 * time.Second)},
		},
	}
	got := tl.Summary()
	want := timeline.Summary{
		Path:  []domain.Status{domain.StatusSubmitted, domain.StatusFulfillmentRequested, domain.StatusRejected},
		Final: true, Took: 1250 * time.Millisecond, Reason: "out of stock: OOS-1",
		Messages: 2, Deliveries: 3, Notifications: 3,
		Failed: 2, Pending: 1, Retried: 3,
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("summary %+v, want %+v", got, want)
	}

	notes := map[string]string{}
	for _, h := range tl.Hops() {
		if (h.Kind == timeline.KindTransition) != (h.Status != "") {
			t.Errorf("hop %q (%s) has status %q: only a transition names one", h.Summary, h.Kind, h.Status)
		}
		if h.Retried != "" {
			notes[h.Summary] = h.Retried
		}
	}
	wantNotes := map[string]string{
		"published order.submitted":            "failed 2 times, published on retry",
		"order.submitted: PROCESSED (APPLIED)": "failed once, processed on retry",
		"notification order_received: SENT":    "failed once, delivered on retry",
	}
	if !maps.Equal(notes, wantNotes) {
		t.Errorf("retried notes %v, want %v", notes, wantNotes)
	}

	// An order on its way is not final; its time is to its last change.
	tl.History = tl.History[:2]
	if s := tl.Summary(); s.Final || s.Took != 40*time.Millisecond || s.Reason != "" {
		t.Errorf("an order on its way: %+v", s)
	}
}

// An order that is not there is domain.ErrNotFound.
func TestTimelineOfUnknownOrder(t *testing.T) {
	t.Parallel()
	db := testenv.NewDatabase(t, migrations.Schemas...)
	_, err := timeline.Read(t.Context(), apiPool(t, db), uuid.New())
	if !errors.Is(err, domain.ErrNotFound) {
		t.Fatalf("err = %v, want domain.ErrNotFound", err)
	}
}

// customerUpdated is a message of another aggregate type.
type customerUpdated struct{ ID string }

func (m customerUpdated) MessageType() string { return "customer.updated" }
func (m customerUpdated) MessageVersion() int { return 1 }
func (m customerUpdated) AggregateID() string { return m.ID }

// The outbox rows' headers reach the timeline as before: the four it shows,
// a header that is not a string as none, and nothing else of the headers.
func TestTimelineOutboxHeaders(t *testing.T) {
	t.Parallel()
	db := testenv.NewDatabase(t, migrations.Schemas...)
	ctx := t.Context()
	order, err := domain.NewOrder(uuid.Must(uuid.NewV7()), "c-1", "EUR", []domain.Item{{SKU: "A-1", Quantity: 1, UnitPriceCents: 100}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.CreateOrder(ctx, db.Pool, order, domain.Cause{CorrelationID: "corr-1"}); err != nil {
		t.Fatal(err)
	}
	const traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	if _, err := db.Pool.Exec(ctx, `
		INSERT INTO message_outbox (outbox_id, aggregate_type, aggregate_id, message_type, message_version, exchange_name, routing_key, payload, headers)
		VALUES (gen_random_uuid(), 'order', $1, 'order.submitted', 1, 'orders', 'order.submitted', '{}',
		        jsonb_build_object('app_id', 7, 'correlation_id', 'corr-1', 'causation_id', 'm-1', 'traceparent', $2::text,
		                           'tracestate', 'vendor=1', 'baggage', 'user=someone'))`, order.ID().String(), traceparent); err != nil {
		t.Fatal(err)
	}
	tl := readTimeline(t, db, order.ID())
	if len(tl.Outbox) != 1 {
		t.Fatalf("%d outbox rows, want 1", len(tl.Outbox))
	}
	r := tl.Outbox[0]
	if r.Producer != "" || r.CorrelationID != "corr-1" || r.CausationID != "m-1" || r.TraceID != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Errorf("producer %q, correlation %q, causation %q, trace %q", r.Producer, r.CorrelationID, r.CausationID, r.TraceID)
	}
}
