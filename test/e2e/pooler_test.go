package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/yourorg/orders/internal/testenv"
	"github.com/yourorg/orders/migrations"
)

// The three binaries behind PgBouncer in transaction mode with the
// pooler's default settings, as most teams deploy them: the relay LISTENs
// past it (RELAY_LISTEN_DATABASE_URL). Orders are posted through the API
// while the pooler is restarted under load: every connection through it
// cut, and new ones refused for a second. A create the API turns away
// (503) is posted again with its Idempotency-Key. No answer is a 500; every order
// is FULFILLED with one transition per step, every outbox row PUBLISHED,
// every inbox row PROCESSED; no process logged a prepared statement that
// a pooled session lacked or already had (SQLSTATE 26000, 42P05).
func TestOrdersThroughPgBouncer(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	pooler := testenv.NewPgBouncer(t, s.dbURL)
	s.procDBURL = pooler.URL(s.dbURL)
	s.startAPI()
	s.startConsumer("consumer")
	relay := testenv.FreeAddr(t)
	s.start("relay", "outbox-relay", "http://"+relay+"/readyz", nil, "ADMIN_ADDR="+relay, "RELAY_ID=relay",
		"RELAY_LISTEN_DATABASE_URL="+testenv.AsRole(s.dbURL, migrations.RoleRelay))

	const n = 120
	ids := make([]string, n)
	var turnedAway, created atomic.Int32
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	wg.Go(func() { // the load, while the test restarts the pooler
		for i := range n {
			wg.Go(func() {
				sem <- struct{}{}
				defer func() { <-sem }()
				order := map[string]any{"customer_id": fmt.Sprint("c-", i), "currency": "EUR",
					"items": []map[string]any{{"sku": "A-1", "quantity": 1, "unit_price_cents": 500}}}
				key := fmt.Sprint("pooled-", i)
				for try := 1; ; try++ {
					code, body := s.postWithKey("/v1/orders", key, order)
					switch {
					case code == http.StatusCreated:
						ids[i] = body["order_id"].(string)
						created.Add(1)
						return
					case code == http.StatusServiceUnavailable && try < 100:
						turnedAway.Add(1)
						time.Sleep(100 * time.Millisecond)
					default:
						t.Errorf("create %d, try %d: %d %v", i, try, code, body)
						return
					}
				}
			})
			time.Sleep(20 * time.Millisecond)
		}
	})
	testenv.WaitFor(t, 30*time.Second, "a third of the orders created", func() bool { return created.Load() >= n/3 })
	pooler.Restart(time.Second)
	wg.Wait()
	if t.Failed() {
		return
	}

	conn, err := pgx.Connect(context.Background(), s.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	count := func(query string) int {
		var n int
		if err := conn.QueryRow(context.Background(), query).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	testenv.WaitFor(t, 90*time.Second, "every order FULFILLED", func() bool {
		return count("SELECT count(*) FROM orders WHERE status = 'FULFILLED'") == n
	})
	testenv.WaitFor(t, 30*time.Second, "every outbox row PUBLISHED and inbox row PROCESSED", func() bool {
		return count("SELECT count(*) FROM message_outbox WHERE status <> 'PUBLISHED'")+
			count("SELECT count(*) FROM message_inbox WHERE status <> 'PROCESSED'") == 0
	})
	for _, id := range ids {
		rows, err := conn.Query(context.Background(), "SELECT coalesce(from_status, '') || '>' || to_status FROM order_state_transition WHERE order_id = $1 ORDER BY transition_id", id)
		if err != nil {
			t.Fatal(err)
		}
		history, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		if !validHistory(history, "FULFILLED") {
			t.Errorf("order %s: history %v", id, history)
		}
	}
	for name := range s.procs {
		if out := s.output(name); strings.Contains(out, "SQLSTATE 26000") || strings.Contains(out, "SQLSTATE 42P05") {
			t.Errorf("%s met a prepared statement a pooled session lacked or had", name)
		}
	}
	t.Logf("%d orders, %d creates turned away (503) and posted again while the pooler restarted", n, turnedAway.Load())
	for _, name := range []string{"relay", "consumer", "order-api"} {
		s.stop(name)
	}
}
