package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/yourorg/orders/internal/consumer"
	"github.com/yourorg/orders/internal/messaging/outbox"
	"github.com/yourorg/orders/internal/testenv"
)

// With MESSAGE_PARTITIONS, every consumer applies the messages of an order
// in the order they were written, whatever the number of relays and
// consumer replicas, and through a relay and a consumer replica killed
// (SIGKILL) mid-run: 3 relays share the partitions, 3 replicas of
// order-consumer consume them one active replica per partition. Orders are
// cancelled at random moments, so that an order's order.cancelled races
// its fulfillment messages. Checked from the database: for each consumer
// and each order, the inbox rows in the order they were applied are the
// order's outbox rows of the types the consumer reads, in the order they
// were written; each order's history is one chain of transitions; every
// order is final; nothing is parked.
func TestOrdersKeepTheirOrderAcrossReplicas(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	s.env = append(s.env, "MESSAGE_PARTITIONS=8", "RELAY_LEASE=3s", "RELAY_CONFIRM_TIMEOUT=1s", oneMessagePerTransaction)
	s.startAPI()
	for i := 1; i <= 3; i++ {
		s.startConsumer(fmt.Sprint("consumer-", i))
	}
	for i := 1; i <= 3; i++ {
		s.startRelay(fmt.Sprint("relay-", i))
	}

	const n = 150
	ids := make([]string, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 6)
	for i := range n {
		if i == n/3 {
			s.kill("relay-1")    // its partitions pass to the others when its leases end
			s.kill("consumer-1") // the partitions it was active on pass to another replica
		}
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			sku := "A-1"
			if i%7 == 1 {
				sku = "OOS-1"
			}
			code, body := s.post("/v1/orders", map[string]any{"customer_id": fmt.Sprint("c-", i), "currency": "EUR",
				"items": []map[string]any{{"sku": sku, "quantity": 1, "unit_price_cents": 500}}})
			if code != http.StatusCreated {
				t.Errorf("create: %d", code)
				return
			}
			ids[i] = body["order_id"].(string)
			if i%3 == 0 {
				time.Sleep(time.Duration(rand.IntN(60)) * time.Millisecond)
				s.post("/v1/orders/"+ids[i]+"/cancel", nil)
			}
		})
		time.Sleep(10 * time.Millisecond)
	}
	wg.Wait()
	if t.Failed() {
		return
	}

	conn, err := pgx.Connect(context.Background(), s.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	ctx := context.Background()
	testenv.WaitFor(t, 90*time.Second, "every order to be final", func() bool {
		var open int
		_ = conn.QueryRow(ctx, `SELECT count(*) FROM orders WHERE status NOT IN ('FULFILLED', 'REJECTED', 'CANCELLED')`).Scan(&open)
		return open == 0
	})
	testenv.WaitFor(t, 60*time.Second, "every message to be processed by every reader", func() bool {
		var pending int
		_ = conn.QueryRow(ctx, `SELECT count(*) FROM message_outbox WHERE status <> 'PUBLISHED'`).Scan(&pending)
		return pending == 0
	})

	checkEachOrderInOrder(t, conn, ids)
}

// oneMessagePerTransaction is the consumers' setting under
// checkEachOrderInOrder: an inbox row's processed_at is its transaction's
// time, the same for every message of a batch, so the database tells the
// order in which a consumer applied an order's messages only when each
// went in a transaction of its own. (The order within a batch is the
// worker's, tested in the inbox package.)
const oneMessagePerTransaction = "CONSUMER_BATCH_SIZE=1"

// checkEachOrderInOrder checks, from the database, that every consumer
// applied each order's messages of the types it reads once each, in the
// order they were written; that each order's history is one chain of
// transitions; and that nothing is parked.
func checkEachOrderInOrder(t *testing.T, conn *pgx.Conn, ids []string) {
	t.Helper()
	ctx := context.Background()
	n := len(ids)
	readers := consumer.Readers(0) // message type -> its readers' queues
	for _, c := range consumer.All(consumer.Deps{}) {
		reads := map[string]bool{}
		for _, typ := range c.Types() {
			reads[typ] = slices.ContainsFunc(readers[typ], func(r outbox.Reader) bool { return r.Queue == "orders."+c.Name() })
		}
		checked := 0
		for _, id := range ids {
			written := rowsOf(t, conn, `SELECT outbox_id::text, message_type FROM message_outbox WHERE aggregate_id = $1 ORDER BY created_at, outbox_id`, id)
			var want []string
			for _, w := range written {
				if reads[w[1]] {
					want = append(want, w[0])
				}
			}
			var applied []string
			testenv.WaitFor(t, 30*time.Second, fmt.Sprintf("%s to process the messages of order %s", c.Name(), id), func() bool {
				applied = nil
				var at []string
				for _, r := range rowsOf(t, conn, `SELECT message_id, status, coalesce(processed_at::text, '') FROM message_inbox
					WHERE consumer_name = $1 AND aggregate_id = $2 ORDER BY processed_at, first_received_at`, c.Name(), id) {
					if r[1] != "PROCESSED" {
						return false
					}
					applied = append(applied, r[0])
					at = append(at, r[2])
				}
				if len(at) != len(slices.Compact(slices.Clone(at))) {
					t.Fatalf("%s applied two messages of order %s in one transaction (%v at %v): run the consumers with %s",
						c.Name(), id, applied, at, oneMessagePerTransaction)
				}
				return len(applied) == len(want)
			})
			if !slices.Equal(applied, want) {
				t.Errorf("%s applied the messages of order %s as %v, written as %v", c.Name(), id, applied, want)
			}
			checked += len(applied)
		}
		t.Logf("%s: %d messages of %d orders, each order's in order", c.Name(), checked, n)
	}
	for _, id := range ids {
		history := rowsOf(t, conn, `SELECT coalesce(from_status, ''), to_status FROM order_state_transition WHERE order_id = $1 ORDER BY created_at`, id)
		for i := 1; i < len(history); i++ {
			if history[i][0] != history[i-1][1] {
				t.Errorf("order %s: history %v is not one chain", id, history)
				break
			}
		}
	}
	var parked int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM message_inbox WHERE status IN ('PERMANENT_FAILED', 'POISONED')`).Scan(&parked); err != nil || parked != 0 {
		t.Fatalf("%d messages parked (%v)", parked, err)
	}
}

// rowsOf runs query and returns its rows as text columns.
func rowsOf(t *testing.T, conn *pgx.Conn, query string, args ...any) [][]string {
	t.Helper()
	rows, err := conn.Query(context.Background(), query, args...)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) ([]string, error) {
		vals, err := r.Values()
		row := make([]string, len(vals))
		for i, v := range vals {
			row[i] = fmt.Sprint(v)
		}
		return row, err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}
