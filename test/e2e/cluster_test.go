package e2e

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/yourorg/orders/internal/consumer"
	"github.com/yourorg/orders/internal/testenv"
)

// clusterRate is the load of TestANodeDiesUnderLoad, orders per second.
const clusterRate = 50

// A RabbitMQ node dies under load, three times: the processes (order-api,
// two relays, the consumer) run against a cluster of three nodes, their
// AMQP_URL listing all three, with the service's queues as quorum queues
// replicated on every node. At 50 orders/s, each node in turn is killed
// (kill -9 of its Erlang VM; the first is the leader of orders.fulfillment,
// the busiest queue) and, six seconds later, started again; the load
// pauses while it rejoins and the flow drains, and resumes three seconds
// before the next kill.
//
// It holds the service to RabbitMQ's promise (a confirmed message on a
// quorum queue survives while a majority of its replicas do) and to its
// own: no message lost, no effect applied twice, every order final in the
// status its story calls for, nothing parked. It counts as RabbitMQ's
// Jepsen tests do (docs/reliability.md has the figures): published (the
// relays' publishes), confirmed, lost (confirmed, never consumed) and
// duplicated (deliveries of a message after its first: the inbox absorbs
// them), and measures, for each kill, how long the relays and each
// consumer paused and how long the first order placed after the kill
// took to be final.
func TestANodeDiesUnderLoad(t *testing.T) {
	t.Parallel()
	c := testenv.NewRabbitCluster(t)
	s := newSystemOn(t, c.NewVhost)
	s.env = append(s.env, "MESSAGE_PARTITIONS=0") // one work queue per consumer, whose leader is killed first
	s.startConsumer("consumer-1")                 // first: it declares the queues the relays publish to
	relays := []string{s.startRelay("relay-1"), s.startRelay("relay-2")}
	s.startAPI()

	// Every queue of the service is a quorum queue with a replica on each
	// node (the default initial group size, 3, is the whole cluster).
	queues := c.Queues(t, s.amqpURL)
	if !slices.ContainsFunc(queues, func(q testenv.QuorumQueue) bool { return q.Name == "orders.fulfillment" }) {
		t.Fatalf("no quorum queue orders.fulfillment among %v", queues)
	}
	for _, q := range queues {
		if len(q.Members) != len(c.Nodes) {
			t.Errorf("queue %s has replicas on %v, want every node", q.Name, q.Members)
		}
	}

	db, err := pgx.Connect(context.Background(), s.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(context.Background())

	ld := startClusterLoad(s, clusterRate)
	t.Cleanup(func() { ld.stop() }) // when the test fails before it stops the load
	nackWait := watchNackWait(t, s.dbURL)
	time.Sleep(5 * time.Second) // steady state first

	// The first kill is the leader of the busiest queue, then the others.
	first := c.Leader(t, s.amqpURL, "orders.fulfillment")
	targets := append([]*testenv.RabbitNode{first}, slices.DeleteFunc(slices.Clone(c.Nodes), func(n *testenv.RabbitNode) bool { return n == first })...)
	var kills []nodeKill
	for _, node := range targets {
		k := nodeKill{node: node.Name}
		for _, q := range c.Queues(t, s.amqpURL) {
			if q.Leader == node.Name && !strings.Contains(q.Name, ".retry.") {
				k.led = append(k.led, q.Name)
			}
		}
		k.at = time.Now()
		node.Kill(t)
		// Six seconds under load with the node down. (How long the flow
		// stalled is read from the database afterwards.) Then the load
		// pauses while the node boots again on its data and rejoins, which
		// takes minutes on a busy machine, and the flow drains, so that
		// the next kill starts from a steady flow.
		time.Sleep(time.Until(k.at.Add(6 * time.Second)))
		ld.pause()
		restart := time.Now()
		node.Start(t)
		k.back = time.Since(restart)
		c.AwaitQueue(t, s.amqpURL, "orders.fulfillment", node.Name+" to be an online member of orders.fulfillment again", func(q testenv.QuorumQueue) bool {
			return slices.Contains(q.Online, node.Name)
		})
		testenv.WaitFor(t, 5*time.Minute, "the flow to drain after the kill of "+node.Name, func() bool {
			var left int
			_ = db.QueryRow(context.Background(), "SELECT count(*) FROM orders WHERE status NOT IN ('FULFILLED', 'REJECTED', 'CANCELLED')").Scan(&left)
			return left == 0
		})
		kills = append(kills, k)
		ld.resume()
		time.Sleep(3 * time.Second)
	}
	placed, loadTime := ld.stop()
	// The survivors nack while a node's queues elect new leaders; the rows
	// they nacked wait seconds, never minutes (outbox nackWaitMax), and
	// are due again as soon as the broker confirms.
	if longest, rows := nackWait(); longest > 6*time.Second {
		t.Errorf("a row the broker nacked was set to wait %s (of %d nacked rows seen waiting); want 5 s at most", longest.Round(time.Second), rows)
	} else {
		t.Logf("nacked rows seen waiting: %d, the longest wait set %s", rows, longest.Round(10*time.Millisecond))
	}
	t.Logf("orders placed: %d in %s, 503s retried under the same key: %d", len(placed), loadTime.Round(time.Second), ld.retries())
	if t.Failed() {
		return
	}

	// Every order final, in the status its story calls for, one
	// transition per step.
	wantStatus := map[string]string{}
	for _, o := range placed {
		wantStatus[o.id] = "FULFILLED"
		if o.oos {
			wantStatus[o.id] = "REJECTED"
		}
	}
	count := func(query string, args ...any) int {
		t.Helper()
		var n int
		if err := db.QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	// On a machine busy with other tests the flow may fall behind the load;
	// it has minutes to catch up.
	testenv.WaitFor(t, 5*time.Minute, "every order to be final", func() bool {
		return count("SELECT count(*) FROM orders WHERE status NOT IN ('FULFILLED', 'REJECTED', 'CANCELLED')") == 0
	})
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		if count("SELECT count(*) FROM message_outbox WHERE status <> 'PUBLISHED'")+
			count("SELECT count(*) FROM message_inbox WHERE status <> 'PROCESSED'") == 0 {
			break
		}
		if time.Now().After(deadline) {
			rows, err := db.Query(context.Background(), `SELECT 'outbox ' || status || ': ' || count(*) || ', last error ' || coalesce(max(last_error), '-')
				FROM message_outbox WHERE status <> 'PUBLISHED' GROUP BY status
				UNION ALL SELECT 'inbox ' || consumer_name || ' ' || status || ': ' || count(*) FROM message_inbox WHERE status <> 'PROCESSED' GROUP BY consumer_name, status`)
			if err != nil {
				t.Fatal(err)
			}
			left, _ := pgx.CollectRows(rows, pgx.RowTo[string])
			t.Fatalf("a minute after every order was final, rows are still in flight:\n%s", strings.Join(left, "\n"))
		}
	}
	rows, err := db.Query(context.Background(), `SELECT o.order_id::text, o.status,
		array_agg(coalesce(t.from_status, '') || '>' || t.to_status ORDER BY t.transition_id)
		FROM orders o JOIN order_state_transition t USING (order_id) GROUP BY o.order_id, o.status`)
	if err != nil {
		t.Fatal(err)
	}
	var id, status string
	var history []string
	final := map[string]int{}
	if _, err := pgx.ForEachRow(rows, []any{&id, &status, &history}, func() error {
		final[status]++
		if want := wantStatus[id]; status != want {
			t.Errorf("order %s is %s, want %s", id, status, want)
		}
		if !validHistory(history, status) {
			t.Errorf("order %s (%s): history %v", id, status, history)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if n := len(wantStatus); count("SELECT count(*) FROM orders") != n {
		t.Errorf("%d orders in the database, %d placed", count("SELECT count(*) FROM orders"), n)
	}

	// Lost: a published message of a type a consumer reads, with no inbox
	// row of that consumer. Parked: anything in a parking lot.
	lost := 0
	for _, cons := range consumer.All(consumer.Deps{}) {
		n := count(`SELECT count(*) FROM message_outbox o WHERE status = 'PUBLISHED' AND message_type = ANY($2)
			AND NOT EXISTS (SELECT 1 FROM message_inbox i WHERE i.consumer_name = $1 AND i.message_id = o.outbox_id::text)`,
			cons.Name(), cons.Types())
		if n > 0 {
			t.Errorf("consumer %s: %d published messages never received", cons.Name(), n)
		}
		lost += n
	}
	parked := 0
	for _, q := range c.Queues(t, s.amqpURL) {
		if strings.HasSuffix(q.Name, ".dlq") {
			parked += q.Messages
		}
	}
	if parked > 0 {
		t.Errorf("%d messages parked", parked)
	}

	// Applied twice: what a second application of a message would leave.
	twice := map[string]string{
		"order transitions (order, to status)":     "SELECT count(*) FROM (SELECT 1 FROM order_state_transition GROUP BY order_id, to_status HAVING count(*) > 1) t",
		"follow-up messages (order, message type)": "SELECT count(*) FROM (SELECT 1 FROM message_outbox GROUP BY aggregate_id, message_type HAVING count(*) > 1) t",
		"stock reservations per order":             "SELECT count(*) FROM (SELECT 1 FROM stock_reservation GROUP BY order_id HAVING count(*) > 1) t",
		"shipments per order":                      "SELECT count(*) FROM (SELECT 1 FROM shipment GROUP BY order_id HAVING count(*) > 1) t",
		"notifications (order, kind)":              "SELECT count(*) FROM (SELECT 1 FROM customer_notification GROUP BY order_id, kind HAVING count(*) > 1) t",
	}
	appliedTwice := 0
	for what, query := range twice {
		if n := count(query); n > 0 {
			t.Errorf("applied twice: %d %s", n, what)
			appliedTwice += n
		}
	}

	// The Jepsen-style counts, from the processes' own metrics.
	var attempts = map[string]float64{}
	for _, r := range relays {
		text := scrape(t, r)
		for _, outcome := range []string{"confirmed", "nacked", "unroutable", "timeout", "connection_lost", "not_published", "shutdown"} {
			attempts[outcome] += sumMetricWhere(text, "outbox_publish_attempts_total", `outcome="`+outcome+`"`)
		}
	}
	published := attempts["confirmed"] + attempts["nacked"] + attempts["unroutable"] + attempts["timeout"] + attempts["connection_lost"] + attempts["shutdown"]
	metrics := scrape(t, s.admin["consumer-1"])
	received := sumMetric(metrics, "consumer_messages_received_total")
	messages := count("SELECT count(*) FROM message_inbox")
	duplicated := int(received) - messages
	if sumMetric(metrics, "consumer_messages_parked_total") > 0 {
		t.Errorf("the consumer parked %v messages", sumMetric(metrics, "consumer_messages_parked_total"))
	}
	rows2 := count("SELECT count(*) FROM message_outbox")
	t.Logf("%d orders in %s of load (%.1f/s), final %v", len(placed), loadTime.Round(time.Second), float64(len(placed))/loadTime.Seconds(), final)
	t.Logf("outbox rows %d; published %.0f (confirmed %.0f, connection lost %.0f, timed out %.0f, nacked %.0f, unroutable %.0f, not published %.0f); "+
		"messages consumed %d (deliveries %.0f); lost %d; duplicated %d (redelivered %.0f, of which already processed %.0f); applied twice %d; parked %d",
		rows2, published, attempts["confirmed"], attempts["connection_lost"], attempts["timeout"], attempts["nacked"], attempts["unroutable"], attempts["not_published"],
		messages, received, lost, duplicated, sumMetric(metrics, "consumer_messages_redelivered_total"),
		sumMetric(metrics, "consumer_messages_duplicates_total"), appliedTwice, parked)

	// For each kill: how long the relays and each consumer paused (the
	// longest gap between two publishes, two first receipts, in the ten
	// seconds after the kill; at 50 orders/s the usual gap is some ten
	// milliseconds), how long the first order placed after the kill took
	// to be final, the worst latency of the orders placed around it.
	for _, k := range kills {
		k.resumed = firstOrderFinalAfter(t, db, k.at)
		from, to := k.at, k.at.Add(10*time.Second)
		relayPause := maxGap(t, db, "SELECT published_at FROM message_outbox WHERE published_at BETWEEN $1 AND $2", from, to)
		var pauses []string
		var worstConsumer time.Duration
		for _, cons := range consumer.Names() {
			p := maxGap(t, db, "SELECT first_received_at FROM message_inbox WHERE consumer_name = '"+cons+"' AND first_received_at BETWEEN $1 AND $2", from, to)
			worstConsumer = max(worstConsumer, p)
			pauses = append(pauses, fmt.Sprintf("%s %s", cons, p.Round(time.Millisecond)))
		}
		var worst time.Duration
		if err := db.QueryRow(context.Background(), `SELECT coalesce(max(f.created_at - o.created_at), '0') FROM orders o
			JOIN order_state_transition f ON f.order_id = o.order_id AND f.to_status IN ('FULFILLED', 'REJECTED')
			WHERE o.created_at BETWEEN $1 AND $2`, k.at.Add(-2*time.Second), k.at.Add(5*time.Second)).Scan(&worst); err != nil {
			t.Fatal(err)
		}
		t.Logf("kill -9 %s (leader of %s): relays paused %s at most, consumers %s (%s); first order placed after it final in %s; "+
			"worst latency of the orders placed from 2s before to 5s after %s; the node was back in %s",
			k.node, strings.Join(k.led, ", "), relayPause.Round(time.Millisecond), worstConsumer.Round(time.Millisecond), strings.Join(pauses, ", "),
			k.resumed.Round(time.Millisecond), worst.Round(time.Millisecond), k.back.Round(100*time.Millisecond))
	}
	var median, worst time.Duration // before the first kill: the flow undisturbed
	if err := db.QueryRow(context.Background(), `SELECT coalesce(percentile_cont(0.5) WITHIN GROUP (ORDER BY f.created_at - o.created_at), '0'),
		coalesce(max(f.created_at - o.created_at), '0') FROM orders o
		JOIN order_state_transition f ON f.order_id = o.order_id AND f.to_status IN ('FULFILLED', 'REJECTED')
		WHERE o.created_at < $1`, kills[0].at.Add(-time.Second)).Scan(&median, &worst); err != nil {
		t.Fatal(err)
	}
	t.Logf("before the first kill, latency (POST to final) median %s, worst %s", median.Round(time.Millisecond), worst.Round(time.Millisecond))
	t.Logf("relay-1 reconnects %d, relay-2 %d, consumer-1 %d (of which the broker cancelling a consumer: %d)",
		strings.Count(s.output("relay-1"), "broker session ended; reconnecting"), strings.Count(s.output("relay-2"), "broker session ended; reconnecting"),
		strings.Count(s.output("consumer-1"), "broker session ended; reconnecting"), strings.Count(s.output("consumer-1"), "the broker cancelled the consumer"))

	for _, name := range []string{"relay-1", "relay-2", "consumer-1", "order-api"} {
		s.stop(name)
	}
}

// nodeKill is what TestANodeDiesUnderLoad saw of one kill.
type nodeKill struct {
	node    string
	led     []string // the queues it led when killed (retry queues aside)
	at      time.Time
	resumed time.Duration // until the first order placed after the kill was final
	back    time.Duration // the restart, until the node took connections
}

// firstOrderFinalAfter says how long after since the first order placed
// after since was final (every order is final by now).
func firstOrderFinalAfter(t *testing.T, db *pgx.Conn, since time.Time) time.Duration {
	t.Helper()
	var at *time.Time
	if err := db.QueryRow(context.Background(), `SELECT min(f.created_at) FROM orders o
		JOIN order_state_transition f ON f.order_id = o.order_id AND f.to_status IN ('FULFILLED', 'REJECTED')
		WHERE o.created_at > $1`, since).Scan(&at); err != nil || at == nil {
		t.Fatalf("no order placed after %s is final: %v", since.Format(time.TimeOnly), err)
	}
	return at.Sub(since)
}

// maxGap is the longest time between two consecutive timestamps of query
// (which selects them between $1 and $2), the first gap from $1 included.
func maxGap(t *testing.T, db *pgx.Conn, query string, from, to time.Time) time.Duration {
	t.Helper()
	rows, err := db.Query(context.Background(), query+" ORDER BY 1", from, to)
	if err != nil {
		t.Fatal(err)
	}
	stamps, err := pgx.CollectRows(rows, pgx.RowTo[time.Time])
	if err != nil {
		t.Fatal(err)
	}
	var longest time.Duration
	prev := from
	for _, ts := range stamps {
		longest = max(longest, ts.Sub(prev))
		prev = ts
	}
	return longest
}

// sumMetricWhere adds up the series of a counter whose labels include
// label (outcome="confirmed").
func sumMetricWhere(text, name, label string) float64 {
	var lines []string
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, name+"{") && strings.Contains(line, label) {
			lines = append(lines, line)
		}
	}
	return sumMetric("\n"+strings.Join(lines, "\n"), name)
}

// clusterLoad places orders at a steady rate until stopped, except while
// paused: one in ten for a sku out of stock (REJECTED), the rest
// FULFILLED.
type clusterLoad struct {
	done    chan struct{}
	stopped sync.Once
	wg      sync.WaitGroup

	mu      sync.Mutex
	orders  []placed
	paused  bool
	resumed time.Time     // when placing last began
	ran     time.Duration // placing before that
	retried int           // 503s answered with a retry
}

func startClusterLoad(s *system, rate int) *clusterLoad {
	ld := &clusterLoad{done: make(chan struct{}), resumed: time.Now()}
	sem := make(chan struct{}, 16)
	ld.wg.Go(func() {
		tick := time.NewTicker(time.Second / time.Duration(rate))
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-ld.done:
				return
			case <-tick.C:
			}
			ld.mu.Lock()
			paused := ld.paused
			ld.mu.Unlock()
			if paused {
				continue
			}
			sem <- struct{}{}
			ld.wg.Go(func() {
				defer func() { <-sem }()
				o := placed{oos: i%10 == 1}
				sku := "A-1"
				if o.oos {
					sku = "OOS-1"
				}
				code, body := ld.place(s, i, sku)
				if code != http.StatusCreated {
					s.t.Errorf("create an order: %d", code)
					return
				}
				o.id = body["order_id"].(string)
				ld.mu.Lock()
				ld.orders = append(ld.orders, o)
				ld.mu.Unlock()
			})
		}
	})
	return ld
}

// place creates one order as a client of the API should: under an
// Idempotency-Key, and again with the same key after a 503, which the API
// answers when it is at its limit (it may have taken effect: the key makes
// the retry safe). The CI machine runs the cluster next to other test
// packages, so an overloaded moment is expected; a 503 that persists for
// ten seconds is not.
func (ld *clusterLoad) place(s *system, i int, sku string) (int, map[string]any) {
	key := fmt.Sprint("cluster-load-", i)
	order := map[string]any{"customer_id": fmt.Sprint("c-", i), "currency": "EUR",
		"items": []map[string]any{{"sku": sku, "quantity": 1, "unit_price_cents": 500}}}
	for deadline := time.Now().Add(10 * time.Second); ; {
		code, body := s.postWithKey("/v1/orders", key, order)
		if code != http.StatusServiceUnavailable || time.Now().After(deadline) {
			return code, body
		}
		ld.mu.Lock()
		ld.retried++
		ld.mu.Unlock()
		time.Sleep(time.Second) // the API's Retry-After
	}
}

// retries says how many 503s place answered with a retry.
func (ld *clusterLoad) retries() int {
	ld.mu.Lock()
	defer ld.mu.Unlock()
	return ld.retried
}

// pause stops placing orders until resume.
func (ld *clusterLoad) pause() {
	ld.mu.Lock()
	defer ld.mu.Unlock()
	if !ld.paused {
		ld.paused, ld.ran = true, ld.ran+time.Since(ld.resumed)
	}
}

// resume places orders again after pause.
func (ld *clusterLoad) resume() {
	ld.mu.Lock()
	defer ld.mu.Unlock()
	if ld.paused {
		ld.paused, ld.resumed = false, time.Now()
	}
}

// stop stops placing orders, and returns those placed and how long orders
// were placed for (pauses left out).
func (ld *clusterLoad) stop() ([]placed, time.Duration) {
	ld.pause()
	ld.stopped.Do(func() { close(ld.done) })
	ld.wg.Wait()
	ld.mu.Lock()
	defer ld.mu.Unlock()
	return ld.orders, ld.ran
}

// watchNackWait samples, four times a second until it is called, how far
// ahead the outbox rows the broker nacked are set to wait, and returns the
// longest wait seen and how many such rows were seen at most at once.
func watchNackWait(t *testing.T, dbURL string) func() (time.Duration, int) {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu      sync.Mutex
		longest time.Duration
		most    int
	)
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		defer conn.Close(context.Background())
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			var wait float64
			var rows int
			if err := conn.QueryRow(context.Background(), `SELECT coalesce(extract(epoch FROM max(next_attempt_at - updated_at)), 0), count(*)
				FROM message_outbox WHERE status = 'PENDING' AND last_error = 'nacked by RabbitMQ' AND next_attempt_at > now()`).Scan(&wait, &rows); err != nil {
				continue // the database is busy; the next sample
			}
			mu.Lock()
			longest, most = max(longest, time.Duration(wait*float64(time.Second))), max(most, rows)
			mu.Unlock()
		}
	}()
	var once sync.Once
	result := func() (time.Duration, int) {
		once.Do(func() { close(stop); <-done })
		mu.Lock()
		defer mu.Unlock()
		return longest, most
	}
	t.Cleanup(func() { result() })
	return result
}
