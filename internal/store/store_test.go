package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/yourorg/orders/migrations"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/domain"
	"github.com/yourorg/orders/internal/messaging"
	"github.com/yourorg/orders/internal/messaging/outbox/outboxadmin"
	"github.com/yourorg/orders/internal/store"
	"github.com/yourorg/orders/internal/testenv"
)

type testBundle struct {
	ctx  context.Context
	pool *pgxpool.Pool
}

func setup(t *testing.T) testBundle {
	t.Helper()
	return testBundle{ctx: t.Context(), pool: testenv.NewDatabase(t, migrations.Schemas...).Pool}
}

func newOrder(t *testing.T) *domain.Order {
	t.Helper()
	o, err := domain.NewOrder(uuid.Must(uuid.NewV7()), "c-1", "EUR", []domain.Item{
		{SKU: "A-1", Quantity: 2, UnitPriceCents: 1250},
		{SKU: "B-2", Quantity: 1, UnitPriceCents: 99},
	})
	if err != nil {
		t.Fatal(err)
	}
	return o
}

func count(t *testing.T, db database.DBTX, table string) int {
	t.Helper()
	var n int
	if err := db.QueryRow(context.Background(), "SELECT count(*) FROM "+table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// createWithOutbox is the transaction of POST /v1/orders.
func createWithOutbox(ctx context.Context, db *pgxpool.Pool, o *domain.Order, cause domain.Cause, after func(pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		created, err := store.CreateOrder(ctx, tx, o, cause)
		if err != nil {
			return err
		}
		if _, err := store.OutboxWriter("order-api").Write(ctx, tx, messaging.Cause(cause), domain.SubmittedMessage(created)); err != nil {
			return err
		}
		if after != nil {
			return after(tx)
		}
		return nil
	})
}

func TestCreateOrderCommitsOrderAndOutboxRowTogether(t *testing.T) {
	t.Parallel()
	b := setup(t)
	o := newOrder(t)
	if err := createWithOutbox(b.ctx, b.pool, o, domain.Cause{CorrelationID: "corr-1"}, nil); err != nil {
		t.Fatal(err)
	}

	got, err := store.GetOrder(b.ctx, b.pool, o.ID())
	if err != nil {
		t.Fatal(err)
	}
	if got.Status() != domain.StatusSubmitted || got.TotalCents() != 2599 || len(got.Items()) != 2 || got.Items()[1].SKU != "B-2" {
		t.Fatalf("stored order = %+v", got)
	}

	messages, err := outboxadmin.Aggregate(b.ctx, b.pool, domain.AggregateOrder, o.ID().String())
	if err != nil || len(messages) != 1 {
		t.Fatalf("outbox rows of the order: %+v, %v; want one", messages, err)
	}
	if backlog, err := outboxadmin.Stats(b.ctx, b.pool); err != nil || len(backlog) != 1 || backlog[0].Rows != 1 {
		t.Fatalf("outbox backlog: %+v, %v; want exactly one row", backlog, err)
	}
	m := messages[0]
	row, err := outboxadmin.Get(b.ctx, b.pool, m.ID)
	if err != nil {
		t.Fatal(err)
	}
	if m.ID.Version() != 7 || m.Type != domain.TypeOrderSubmitted || row.Version != 1 || m.Status != "PENDING" ||
		row.Exchange != domain.EventsExchange || row.RoutingKey != m.Type || m.Attempts != 0 {
		t.Fatalf("outbox row: id v%d %s v%d %s %s %s %d", m.ID.Version(), m.Type, row.Version, m.Status, row.Exchange, row.RoutingKey, m.Attempts)
	}
	var p domain.OrderSubmittedV1
	if err := json.Unmarshal(row.Payload, &p); err != nil || p.ID != o.ID() || p.TotalCents != 2599 || len(p.Items) != 2 {
		t.Fatalf("payload %s: %v", row.Payload, err)
	}
	if row.Headers["correlation_id"] != "corr-1" || m.CorrelationID != "corr-1" {
		t.Fatalf("headers %v", row.Headers)
	}

	history, err := store.History(b.ctx, b.pool, o.ID())
	if err != nil || len(history) != 1 || history[0].From != "" || history[0].To != domain.StatusSubmitted ||
		history[0].MessageID != nil || history[0].CorrelationID != "corr-1" {
		t.Fatalf("history = %+v, %v", history, err)
	}
}

// A failure after the outbox insert, inside the same transaction, leaves
// neither the order nor its message.
func TestFailureAfterOutboxInsertLeavesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	o := newOrder(t)
	err := createWithOutbox(b.ctx, b.pool, o, domain.Cause{}, func(tx pgx.Tx) error {
		// Violate a constraint in the same transaction: the same order again.
		_, err := store.CreateOrder(b.ctx, tx, o, domain.Cause{})
		return err
	})
	if !errors.Is(err, domain.ErrConflict) {
		t.Fatalf("err = %v, want the injected unique violation", err)
	}
	for _, table := range []string{"orders", "order_items", "order_state_transition"} {
		if n := count(t, b.pool, table); n != 0 {
			t.Errorf("%s has %d rows after the rollback", table, n)
		}
	}
	if backlog, err := outboxadmin.Stats(b.ctx, b.pool); err != nil || len(backlog) != 0 {
		t.Errorf("outbox rows after the rollback: %+v, %v", backlog, err)
	}
	if _, err := store.GetOrder(b.ctx, b.pool, o.ID()); !errors.Is(err, domain.ErrNotFound) {
		t.Errorf("GetOrder after rollback: %v, want ErrNotFound", err)
	}
}

func TestMoveOrderIsGuarded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	o := newOrder(t)
	if err := createWithOutbox(b.ctx, b.pool, o, domain.Cause{}, nil); err != nil {
		t.Fatal(err)
	}

	move, current, err := store.MoveOrder(b.ctx, b.pool, o.ID(), domain.TriggerSubmitted, domain.Cause{MessageID: "m-1", CorrelationID: "c"})
	if err != nil || current != domain.StatusSubmitted || move.From != domain.StatusSubmitted || move.To != domain.StatusFulfillmentRequested || move.Version != 2 {
		t.Fatalf("MoveOrder = %+v, %s, %v", move, current, err)
	}
	// The same trigger again finds the order past it, and moves nothing.
	if _, current, err := store.MoveOrder(b.ctx, b.pool, o.ID(), domain.TriggerSubmitted, domain.Cause{MessageID: "m-2"}); !errors.Is(err, domain.ErrStaleTransition) || current != domain.StatusFulfillmentRequested {
		t.Fatalf("second move: %s, %v; want ErrStaleTransition", current, err)
	}
	// One message moves one order once: (order_id, message_id) is unique,
	// and the transaction that tried rolls back its update too.
	err = pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		_, _, err := store.MoveOrder(b.ctx, tx, o.ID(), domain.TriggerFulfillmentCompleted, domain.Cause{MessageID: "m-1"})
		return err
	})
	if !errors.Is(err, domain.ErrConflict) {
		t.Fatalf("same message twice: %v, want ErrConflict", err)
	}
	if ok, err := store.TransitionRecorded(b.ctx, b.pool, o.ID(), "m-1"); err != nil || !ok {
		t.Fatalf("TransitionRecorded(m-1) = %v, %v", ok, err)
	}
	if ok, err := store.TransitionRecorded(b.ctx, b.pool, o.ID(), "m-2"); err != nil || ok {
		t.Fatalf("TransitionRecorded(m-2) = %v, %v", ok, err)
	}
	// A move the order is not ready for, and an order that does not exist.
	fresh := newOrder(t)
	if err := createWithOutbox(b.ctx, b.pool, fresh, domain.Cause{}, nil); err != nil {
		t.Fatal(err)
	}
	if _, current, err := store.MoveOrder(b.ctx, b.pool, fresh.ID(), domain.TriggerFulfillmentCompleted, domain.Cause{}); !errors.Is(err, domain.ErrInvalidTransition) || current != domain.StatusSubmitted {
		t.Fatalf("impossible move: %s, %v", current, err)
	}
	if _, _, err := store.MoveOrder(b.ctx, b.pool, uuid.New(), domain.TriggerCancel, domain.Cause{}); !errors.Is(err, domain.ErrNotFound) {
		t.Fatalf("missing order: %v", err)
	}
	got, _ := store.GetOrder(b.ctx, b.pool, o.ID())
	if got.Status() != domain.StatusFulfillmentRequested || got.Version() != 2 {
		t.Fatalf("order is %s v%d", got.Status(), got.Version())
	}
	history, _ := store.History(b.ctx, b.pool, o.ID())
	if len(history) != 2 || history[1].From != domain.StatusSubmitted || history[1].To != domain.StatusFulfillmentRequested || *history[1].MessageID != "m-1" {
		t.Fatalf("history %+v", history)
	}
}

// Concurrent moves of one order: exactly one wins.
func TestMoveOrderConcurrently(t *testing.T) {
	t.Parallel()
	b := setup(t)
	o := newOrder(t)
	if err := createWithOutbox(b.ctx, b.pool, o, domain.Cause{}, nil); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var won atomic.Int32
	for i := range 10 {
		wg.Go(func() {
			trigger := domain.TriggerCancel
			if i%2 == 0 {
				trigger = domain.TriggerSubmitted
			}
			if _, _, err := store.MoveOrder(b.ctx, b.pool, o.ID(), trigger, domain.Cause{MessageID: fmt.Sprint("m-", i)}); err == nil {
				won.Add(1)
			} else if !errors.Is(err, domain.ErrStaleTransition) {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	// Cancel can follow submitted (both from SUBMITTED or FULFILLMENT_REQUESTED),
	// but every trigger moves the order at most once, and the history holds
	// exactly the moves that won.
	history, _ := store.History(b.ctx, b.pool, o.ID())
	if int(won.Load()) != len(history)-1 || won.Load() < 1 || won.Load() > 2 {
		t.Fatalf("%d moves won, history %+v", won.Load(), history)
	}
}

func TestIdempotencyKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	req := store.IdempotentRequest{CallerRole: "customer", Method: "POST", Path: "/v1/orders", Key: "k-1", Hash: "h-1"}
	resp := store.StoredResponse{Status: 201, Body: []byte(`{"a":1}`), Location: "/v1/orders/x"}

	// The first request takes the key and holds it until it commits.
	first, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Rollback(b.ctx) //nolint:errcheck // committed below
	if got, err := store.ClaimIdempotencyKey(b.ctx, first, req, time.Hour); err != nil || got != nil {
		t.Fatalf("first claim = %v, %v", got, err)
	}
	// Meanwhile a second request with the key is told, at once, to wait.
	err = pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		_, err := store.ClaimIdempotencyKey(b.ctx, tx, req, time.Hour)
		return err
	})
	if !errors.Is(err, store.ErrKeyInFlight) {
		t.Fatalf("claim while in flight: %v, want ErrKeyInFlight", err)
	}
	if err := store.CompleteIdempotencyKey(b.ctx, first, req, resp); err != nil {
		t.Fatal(err)
	}
	if err := first.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}

	claim := func(r store.IdempotentRequest, ttl time.Duration) (*store.StoredResponse, error) {
		var got *store.StoredResponse
		err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
			var err error
			got, err = store.ClaimIdempotencyKey(b.ctx, tx, r, ttl)
			return err
		})
		return got, err
	}
	if got, err := claim(req, time.Hour); err != nil || got == nil || got.Status != 201 || string(got.Body) != `{"a":1}` || got.Location != resp.Location {
		t.Fatalf("replay = %+v, %v", got, err)
	}
	other := req
	other.Hash = "h-2"
	if _, err := claim(other, time.Hour); !errors.Is(err, store.ErrKeyReused) {
		t.Fatalf("other body: %v, want ErrKeyReused", err)
	}
	// Once the TTL has run out the key is free for a new request.
	if got, err := claim(other, time.Nanosecond); err != nil || got != nil {
		t.Fatalf("claim of an expired key = %+v, %v", got, err)
	}
}

// A key is its caller's: another caller's request with the same key and
// the same body is a new request, never a replay of the first caller's
// response, and is not held up by it while it runs.
func TestIdempotencyKeyIsTheCallers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	alice := store.IdempotentRequest{CallerRole: "customer", Caller: "alice", Method: "POST", Path: "/v1/orders", Key: "k-1", Hash: "h-1"}
	bob := alice
	bob.Caller = "bob"

	first, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Rollback(b.ctx) //nolint:errcheck // committed below
	if got, err := store.ClaimIdempotencyKey(b.ctx, first, alice, time.Hour); err != nil || got != nil {
		t.Fatalf("alice's claim = %v, %v", got, err)
	}
	claim := func(r store.IdempotentRequest) (*store.StoredResponse, error) {
		var got *store.StoredResponse
		err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
			var err error
			if got, err = store.ClaimIdempotencyKey(b.ctx, tx, r, time.Hour); err != nil || got != nil {
				return err
			}
			return store.CompleteIdempotencyKey(b.ctx, tx, r, store.StoredResponse{Status: 201, Body: []byte(`"bob's"`)})
		})
		return got, err
	}
	if got, err := claim(bob); err != nil || got != nil {
		t.Fatalf("bob's claim while alice's runs = %+v, %v; want his own", got, err)
	}
	if err := store.CompleteIdempotencyKey(b.ctx, first, alice, store.StoredResponse{Status: 201, Body: []byte(`"alice's"`)}); err != nil {
		t.Fatal(err)
	}
	if err := first.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	if got, err := claim(bob); err != nil || got == nil || string(got.Body) != `"bob's"` {
		t.Fatalf("bob's replay = %+v, %v; want his own response", got, err)
	}
	if got, err := claim(alice); err != nil || got == nil || string(got.Body) != `"alice's"` {
		t.Fatalf("alice's replay = %+v, %v; want her own response", got, err)
	}
}

// A caller is a role and a subject: a customer and an operator whose
// tokens name the same sub each have their own keys. The same key with
// another body is no reuse across them, and each replays its own response;
// the retention deletes an expired key of one and keeps the other's.
func TestIdempotencyKeyIsTheCallersRoles(t *testing.T) {
	t.Parallel()
	b := setup(t)
	customer := store.IdempotentRequest{CallerRole: "customer", Caller: "alice", Method: "POST", Path: "/v1/orders", Key: "k-1", Hash: "h-customer"}
	operator := customer
	operator.CallerRole, operator.Hash = "operator", "h-operator"
	claim := func(r store.IdempotentRequest, body string) (*store.StoredResponse, error) {
		var got *store.StoredResponse
		err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
			var err error
			if got, err = store.ClaimIdempotencyKey(b.ctx, tx, r, time.Hour); err != nil || got != nil {
				return err
			}
			return store.CompleteIdempotencyKey(b.ctx, tx, r, store.StoredResponse{Status: 201, Body: []byte(body)})
		})
		return got, err
	}
	for _, r := range []store.IdempotentRequest{customer, operator} {
		if got, err := claim(r, `"`+r.CallerRole+`'s"`); err != nil || got != nil {
			t.Fatalf("the %s's first claim = %+v, %v; want a new request", r.CallerRole, got, err)
		}
	}
	for _, r := range []store.IdempotentRequest{customer, operator} {
		if got, err := claim(r, "again"); err != nil || got == nil || string(got.Body) != `"`+r.CallerRole+`'s"` {
			t.Errorf("the %s's replay = %+v, %v; want its own response", r.CallerRole, got, err)
		}
	}
	if _, err := b.pool.Exec(b.ctx, `UPDATE http_idempotency_key SET created_at = now() - interval '2 hours' WHERE caller_role = 'operator'`); err != nil {
		t.Fatal(err)
	}
	if n, err := store.DeleteExpiredIdempotencyKeys(b.ctx, b.pool, time.Hour, 10); err != nil || n != 1 {
		t.Fatalf("deleted %d expired keys (%v), want the operator's 1", n, err)
	}
	if got, err := claim(customer, "again"); err != nil || got == nil {
		t.Errorf("the customer's key after the operator's expired: %+v, %v; want it kept", got, err)
	}
}

func TestDeleteExpiredIdempotencyKeys(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for i := range 5 {
		req := store.IdempotentRequest{CallerRole: "customer", Method: "POST", Path: "/v1/orders", Key: fmt.Sprint("k-", i), Hash: "h"}
		err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
			if _, err := store.ClaimIdempotencyKey(b.ctx, tx, req, time.Hour); err != nil {
				return err
			}
			return store.CompleteIdempotencyKey(b.ctx, tx, req, store.StoredResponse{Status: 201, Body: []byte("{}")})
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if n, err := store.DeleteExpiredIdempotencyKeys(b.ctx, b.pool, time.Hour, 10); err != nil || n != 0 {
		t.Fatalf("fresh keys deleted: %d, %v", n, err)
	}
	if n, err := store.DeleteExpiredIdempotencyKeys(b.ctx, b.pool, time.Nanosecond, 3); err != nil || n != 3 {
		t.Fatalf("first batch: %d, %v", n, err)
	}
	if n, err := store.DeleteExpiredIdempotencyKeys(b.ctx, b.pool, time.Nanosecond, 3); err != nil || n != 2 {
		t.Fatalf("second batch: %d, %v", n, err)
	}
}

// Walking the pages while orders are being inserted returns every order
// that existed before the walk exactly once, and no order twice.
func TestListOrdersKeysetWhileInserting(t *testing.T) {
	t.Parallel()
	b := setup(t)
	insert := func() uuid.UUID {
		o := newOrder(t)
		if err := createWithOutbox(b.ctx, b.pool, o, domain.Cause{}, nil); err != nil {
			t.Error(err)
		}
		return o.ID()
	}
	before := map[uuid.UUID]bool{}
	for range 120 {
		before[insert()] = true
	}

	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
				insert()
			}
		}
	})

	seen := map[uuid.UUID]int{}
	var after *store.Cursor
	pages := 0
	for {
		orders, next, err := store.ListOrders(b.ctx, b.pool, store.ListParams{Limit: 7, After: after})
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range orders {
			seen[o.ID()]++
		}
		pages++
		if next == nil {
			break
		}
		after = next
	}
	close(stop)
	wg.Wait()

	for id := range before {
		if seen[id] != 1 {
			t.Errorf("order %s seen %d times", id, seen[id])
		}
	}
	for id, n := range seen {
		if n != 1 {
			t.Errorf("order %s seen %d times", id, n)
		}
	}
	if pages < 120/7 {
		t.Fatalf("only %d pages", pages)
	}
}

func TestListOrdersByStatus(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var cancelled []uuid.UUID
	for i := range 9 {
		o := newOrder(t)
		if err := createWithOutbox(b.ctx, b.pool, o, domain.Cause{}, nil); err != nil {
			t.Fatal(err)
		}
		if i%3 == 0 {
			if _, _, err := store.MoveOrder(b.ctx, b.pool, o.ID(), domain.TriggerCancel, domain.Cause{}); err != nil {
				t.Fatal(err)
			}
			cancelled = append(cancelled, o.ID())
		}
	}
	got, next, err := store.ListOrders(b.ctx, b.pool, store.ListParams{Status: domain.StatusCancelled, Limit: 2})
	if err != nil || len(got) != 2 || next == nil {
		t.Fatalf("page 1: %d orders, next %v, %v", len(got), next, err)
	}
	// Newest first.
	if got[0].ID() != cancelled[2] || got[1].ID() != cancelled[1] {
		t.Fatalf("page 1 = %s, %s", got[0].ID(), got[1].ID())
	}
	got, next, err = store.ListOrders(b.ctx, b.pool, store.ListParams{Status: domain.StatusCancelled, Limit: 2, After: next})
	if err != nil || len(got) != 1 || next != nil || got[0].ID() != cancelled[0] {
		t.Fatalf("page 2: %v, next %v, %v", got, next, err)
	}
}

// A customer's page of orders is read along orders_customer_created_idx,
// not by walking every customer's orders newest first: among 5,000 orders
// of others, the plan of ListOrdersByCustomer(AndStatus) names the index.
func TestCustomerListUsesItsIndex(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := b.pool.Exec(b.ctx, `
		INSERT INTO orders (order_id, customer_id, currency, status, version, total_cents)
		SELECT gen_random_uuid(), 'other-' || (i % 500), 'EUR', 'SUBMITTED', 1, 100
		FROM generate_series(1, 5000) AS i`); err != nil {
		t.Fatal(err)
	}
	mine := newOrder(t)
	if err := createWithOutbox(b.ctx, b.pool, mine, domain.Cause{}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(b.ctx, `ANALYZE orders`); err != nil {
		t.Fatal(err)
	}
	for _, status := range []domain.Status{"", domain.StatusSubmitted} {
		// The statements as the store sends them, with their parameters.
		sql, args := `SELECT order_id FROM orders WHERE customer_id = $1
			AND (created_at, order_id) < ($2::timestamptz, $3::uuid)
			ORDER BY created_at DESC, order_id DESC LIMIT 50`, []any{mine.CustomerID(), "infinity", uuid.Max}
		if status != "" {
			sql, args = `SELECT order_id FROM orders WHERE customer_id = $1 AND status = $4
				AND (created_at, order_id) < ($2::timestamptz, $3::uuid)
				ORDER BY created_at DESC, order_id DESC LIMIT 50`, append(args, string(status))
		}
		rows, err := b.pool.Query(b.ctx, "EXPLAIN "+sql, args...)
		if err != nil {
			t.Fatal(err)
		}
		plan, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		if text := fmt.Sprint(plan); !strings.Contains(text, "orders_customer_created_idx") {
			t.Errorf("a customer's orders (status %q) are not read along orders_customer_created_idx:\n%s", status, strings.Join(plan, "\n"))
		}
	}
	got, _, err := store.ListOrders(b.ctx, b.pool, store.ListParams{CustomerID: mine.CustomerID(), Limit: 50})
	if err != nil || len(got) != 1 || got[0].ID() != mine.ID() {
		t.Fatalf("the customer's list: %v, %v", got, err)
	}
}
