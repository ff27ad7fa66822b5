//go:build unix

package e2e

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/yourorg/orders/internal/consumer"
	"github.com/yourorg/orders/internal/testenv"
	"github.com/yourorg/orders/internal/testenv/failover"
)

// The primary dies under load with an asynchronous standby: what many
// managed databases run by default. TestAPrimaryDiesUnderLoad's flow
// (order-api, a polling outbox-relay and order-consumer on the nodes'
// multi-host URL, 10 orders/s, the leader killed with kill -9 and started
// again once the standby leads), on a cluster whose standby is not
// synchronous: the primary acknowledges a COMMIT before the standby has
// it, so the promotion may drop the last commits, after the API answered
// 201 for them and after the relay published their messages.
//
// It runs twice: with the standby streaming as it does, some
// milliseconds behind; and a second behind (the leader's WAL sender held
// with SIGSTOP for a second before the kill, as a standby behind a busy
// link is), so that the failover surely drops commits and the accounting
// below is exercised.
//
// It measures, and logs, what the failover cost: orders answered 201 and
// gone (lost), orders left short of their final status because a consumer
// acknowledged a message whose effect the promotion dropped (stuck),
// messages the broker carried for an order or an outbox row the database
// no longer has (ghosts), and their effects. Loss being possible, it
// asserts none of those is zero; it asserts what holds even so, and that
// the counts add up exactly:
//   - every order in the database is one answered 201, and the orders
//     answered 201 are those in the database plus those lost;
//   - only orders answered before the standby took over are lost;
//   - each order's history is one transition per step of its path, and
//     nothing is applied twice;
//   - every order short of its final status has a published message that
//     a consumer never received (the acknowledged one whose effect was
//     dropped); every message a consumer parked is a ghost: its outbox
//     row or its order is gone.
func TestAnAsyncPrimaryDiesUnderLoad(t *testing.T) {
	if os.Getenv(haVariable) == "" {
		t.Skipf("a PostgreSQL failover under load takes minutes: make test/ha runs it (%s=1)", haVariable)
	}
	t.Parallel()
	for _, tc := range []struct {
		name   string
		behind time.Duration // how long the leader's WAL sender is held before the kill
	}{
		{"streaming", 0},
		{"a second behind", time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) { asyncFailover(t, tc.behind) })
	}
}

func asyncFailover(t *testing.T, behind time.Duration) {
	ctx := context.Background()
	c := testenv.NewPatroniCluster(t, testenv.PatroniOptions{Async: true})
	name := testenv.TestDatabaseName()
	c.CreateDatabase(t, name)
	s := newSystemAt(t, c.URL(name), testenv.NewVhost(t))
	s.startConsumer("consumer") // first: it declares the queues the relay publishes to
	tap := failover.StartTap(t, s.amqpURL)
	s.startRelay("relay")
	s.startAPI()

	ld := failover.StartLoad(t, failover.API{URL: s.apiURL, Token: s.token, Client: s.client}, failoverRate)
	time.Sleep(5 * time.Second) // steady state first

	release := func() {}
	if behind > 0 {
		release = holdWALSenders(t, c.Leader(t))
		time.Sleep(behind)
	}
	killed := c.KillLeader(t)
	release()
	at := time.Now()
	t.Logf("killed the leader, %s, at %s", killed.Name, at.Format("15:04:05.000"))
	leader := c.WaitLeader(t, killed)
	promoted := time.Now()
	t.Logf("%s leads %s after the kill", leader.Name, promoted.Sub(at).Round(100*time.Millisecond))
	testenv.WaitFor(t, 2*time.Minute, "an order answered 201 after the kill", func() bool { return ld.AnsweredAfter(at) })
	killed.Start(t)
	c.WaitHealthy(t, 3*time.Minute)
	t.Logf("%s back as the standby %s after the kill", killed.Name, time.Since(at).Round(100*time.Millisecond))
	time.Sleep(3 * time.Second) // load on the whole cluster again
	orders := ld.Stop()
	if t.Failed() {
		return
	}

	db, err := pgx.Connect(ctx, s.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(ctx)
	count := func(query string, args ...any) int {
		t.Helper()
		var n int
		if err := db.QueryRow(ctx, query, args...).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	// Settled: every order final, or nothing left to publish or to retry
	// and nothing moving for ten seconds (an order stuck by the failover
	// stays where it is).
	const settledQuery = `SELECT (SELECT count(*) FROM orders WHERE status NOT IN ('FULFILLED', 'REJECTED', 'CANCELLED')),
		(SELECT count(*) FROM message_outbox WHERE status IN ('PENDING', 'PUBLISHING')),
		(SELECT count(*) FROM message_inbox WHERE status IN ('PROCESSING', 'RETRYABLE_FAILED')),
		(SELECT count(*) FROM order_state_transition), (SELECT count(*) FROM message_inbox), (SELECT count(*) FROM message_outbox)`
	var last [6]int
	var still time.Time
	testenv.WaitFor(t, 3*time.Minute, "every order final, or nothing moving for 10s", func() bool {
		var now [6]int
		if err := db.QueryRow(ctx, settledQuery).Scan(&now[0], &now[1], &now[2], &now[3], &now[4], &now[5]); err != nil {
			return false
		}
		if now[0] == 0 && now[1] == 0 && now[2] == 0 {
			return true
		}
		if now != last || now[1] > 0 || now[2] > 0 {
			last, still = now, time.Now()
			return false
		}
		return time.Since(still) >= 10*time.Second
	})

	// The orders answered 201: final, stuck short of it, or lost.
	answered := map[string]failover.Order{}
	var final, stuck, lost []string
	for _, o := range orders {
		answered[o.ID] = o
		var status string
		var history []string
		err := db.QueryRow(ctx, `SELECT o.status, array_agg(coalesce(t.from_status, '') || '>' || t.to_status ORDER BY t.transition_id)
			FROM orders o JOIN order_state_transition t USING (order_id) WHERE o.order_id = $1 GROUP BY o.status`, o.ID).Scan(&status, &history)
		want := o.Want()
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			lost = append(lost, o.ID)
			if o.Answered.After(promoted) {
				t.Errorf("order %s, answered 201 at %s, after %s took over at %s, is not in the database",
					o.ID, o.Answered.Format("15:04:05.000"), leader.Name, promoted.Format("15:04:05.000"))
			}
		case err != nil:
			t.Fatal(err)
		case status == want && slices.Equal(history, failover.Path(status)):
			final = append(final, o.ID)
		case status != want && isPathPrefix(history, want):
			stuck = append(stuck, o.ID)
		default:
			t.Errorf("order %s is %s (history %v), want %s, or a step of its way there", o.ID, status, history, want)
		}
	}
	if n := count("SELECT count(*) FROM orders"); n != len(orders)-len(lost) {
		t.Errorf("%d orders in the database; %d answered 201, of which %d lost", n, len(orders), len(lost))
	}
	if n := count("SELECT count(*) FROM orders WHERE NOT (order_id::text = ANY($1))", slices.Collect(maps.Keys(answered))); n > 0 {
		t.Errorf("%d orders in the database were never answered 201", n)
	}

	// Applied twice: impossible within the one history the database now
	// has, whatever the failover dropped.
	appliedTwice := 0
	for what, query := range failover.AppliedTwiceQueries {
		if n := count(query); n > 0 {
			t.Errorf("applied twice: %d %s", n, what)
			appliedTwice += n
		}
	}

	// Stuck orders: each has a published message a consumer never
	// received, the delivery whose effect the promotion dropped after the
	// consumer had acknowledged it.
	neverReceived := 0
	stuckExplained := map[string]bool{}
	for _, cons := range consumer.All(consumer.Deps{}) {
		rows, err := db.Query(ctx, `SELECT aggregate_id::text FROM message_outbox o WHERE status = 'PUBLISHED' AND message_type = ANY($2)
			AND NOT EXISTS (SELECT 1 FROM message_inbox i WHERE i.consumer_name = $1 AND i.message_id = o.outbox_id::text)`,
			cons.Name(), cons.Types())
		if err != nil {
			t.Fatal(err)
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		neverReceived += len(ids)
		for _, id := range ids {
			stuckExplained[id] = true
		}
	}
	for _, id := range stuck {
		if !stuckExplained[id] {
			t.Errorf("order %s is short of its final status with every message it had received", id)
		}
	}

	// Ghosts: messages the broker carried whose order, or outbox row, the
	// database no longer has.
	seen := tap.Stop()
	var ghostOrders, ghostRows int
	ghostOrderIDs := map[string]bool{}
	var firstGhost, lastGhost time.Time
	for _, m := range seen {
		var rowExists, orderExists bool
		if err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM message_outbox WHERE outbox_id::text = $1),
			EXISTS (SELECT 1 FROM orders WHERE order_id::text = $2)`, m.ID, m.OrderID).Scan(&rowExists, &orderExists); err != nil {
			t.Fatal(err)
		}
		switch {
		case !orderExists:
			ghostOrders++
			ghostOrderIDs[m.OrderID] = true
		case !rowExists:
			ghostRows++
		default:
			continue
		}
		if firstGhost.IsZero() || m.At.Before(firstGhost) {
			firstGhost = m.At
		}
		if m.At.After(lastGhost) {
			lastGhost = m.At
		}
	}
	ghostAnswered := 0
	for _, id := range lost {
		if ghostOrderIDs[id] {
			ghostAnswered++
		}
	}
	// What consumers did with the ghosts: parked them, or applied them to
	// tables of their own for an order that no longer exists (and so
	// made follow-up messages about it, on the new primary: ghosts too).
	if n := count(`SELECT count(*) FROM message_inbox i WHERE status <> 'PROCESSED'
		AND EXISTS (SELECT 1 FROM message_outbox o WHERE o.outbox_id::text = i.message_id)
		AND EXISTS (SELECT 1 FROM orders WHERE order_id::text = i.aggregate_id)`); n > 0 {
		t.Errorf("%d messages a consumer did not process are of an outbox row and an order the database has: only a ghost may be parked", n)
	}
	parked := count("SELECT count(*) FROM message_inbox WHERE status <> 'PROCESSED'")
	var ghostEffects []string
	for _, table := range []string{"stock_reservation", "shipment", "customer_notification"} {
		n := count("SELECT count(*) FROM " + table + " x WHERE NOT EXISTS (SELECT 1 FROM orders o WHERE o.order_id = x.order_id)")
		ghostEffects = append(ghostEffects, fmt.Sprintf("%s %d", table, n))
	}

	at3 := func(ts time.Time) string {
		if ts.IsZero() {
			return "none"
		}
		return fmt.Sprintf("%+.1fs", ts.Sub(at).Seconds())
	}
	t.Logf("%d orders answered 201: %d final, %d stuck short of it, %d lost (%d of them with a message published); creates answered 503 and posted again %d, without an answer %d",
		len(orders), len(final), len(stuck), len(lost), ghostAnswered, ld.Retried(http.StatusServiceUnavailable), ld.Retried(0))
	t.Logf("messages the broker carried %d: ghosts %d of an order the database no longer has (%d orders), %d of an outbox row it no longer has, published from %s to %s of the kill",
		len(seen), ghostOrders, len(ghostOrderIDs), ghostRows, at3(firstGhost), at3(lastGhost))
	t.Logf("published messages a consumer never received %d; parked %d; rows for orders the database no longer has: %s; applied twice %d",
		neverReceived, parked, strings.Join(ghostEffects, ", "), appliedTwice)
	if len(lost) > 0 {
		t.Logf("lost orders: %s", strings.Join(lost, " "))
	}
	for _, name := range []string{"order-api", "relay", "consumer"} {
		t.Logf("%s's warnings and errors: %s", name, logSummary(s.output(name)))
	}

	for _, name := range []string{"relay", "consumer", "order-api"} {
		s.stop(name)
	}
}

// holdWALSenders stops (SIGSTOP) the processes that stream the WAL of
// node, the leader, to its standby: the primary goes on committing, the
// standby receives nothing more. The function it returns kills them, for
// after the kill of the node: a stopped process does not see its
// postmaster die, and would hold the node's shared memory, so that
// PostgreSQL could not start there again. It runs at t's end too.
func holdWALSenders(t *testing.T, node *testenv.PatroniNode) (kill func()) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, node.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, "SELECT pid FROM pg_stat_replication")
	if err != nil {
		t.Fatal(err)
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil || len(pids) == 0 {
		t.Fatalf("the WAL senders of %s: %v %v", node.Name, pids, err)
	}
	kill = sync.OnceFunc(func() {
		for _, pid := range pids {
			_ = syscall.Kill(int(pid), syscall.SIGKILL)
		}
	})
	t.Cleanup(kill)
	for _, pid := range pids {
		if err := syscall.Kill(int(pid), syscall.SIGSTOP); err != nil {
			t.Fatalf("stop WAL sender %d: %v", pid, err)
		}
	}
	return kill
}

// isPathPrefix says whether history is the start of the path to final,
// one transition per step: where an order stuck on its way stands.
func isPathPrefix(history []string, final string) bool {
	path := failover.Path(final)
	return len(history) > 0 && len(history) < len(path) && slices.Equal(history, path[:len(history)])
}
