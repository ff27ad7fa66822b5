package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/yourorg/orders/internal/consumer"
	"github.com/yourorg/orders/internal/messaging/inbox"
	"github.com/yourorg/orders/internal/testenv"
)

// A running system moves from MESSAGE_PARTITIONS=0 to 8, and then to 4, by
// the procedure of docs/scaling.md#changing-the-partitions, while order-api
// takes orders throughout and messages wait in the outbox and in the
// queues: stop the relays, let the consumers drain their queues, restart
// the consumers at the new count, delete the queues it no longer uses
// (empty), start the relays at it. Every consumer
// applies every message once, each order's in the order written. With the
// polling relay, and with the log-tailing one (RELAY_MODE=wal), whose
// waiting messages wait in its slot too: in a wal run only (make
// test/wal).
func TestChangingThePartitionsLosesAndReordersNothing(t *testing.T) {
	t.Parallel()
	t.Run("poll", func(t *testing.T) {
		t.Parallel()
		changeThePartitions(t, newSystem(t))
	})
	t.Run("wal", func(t *testing.T) {
		t.Parallel()
		testenv.SkipUnlessWAL(t)
		changeThePartitions(t, newWALSystem(t))
	})
}

// changeThePartitions is TestChangingThePartitionsLosesAndReordersNothing
// on s.
func changeThePartitions(t *testing.T, s *system) {
	// One worker: at 0 partitions, a second would apply an order's
	// messages in either order, whatever the change does.
	s.env = append(s.env, "MESSAGE_PARTITIONS=0", "CONSUMER_WORKERS=1", oneMessagePerTransaction)
	s.startAPI()
	s.startConsumer("consumer-a")
	s.startRelay("relay-a")

	var (
		ids  []string
		mu   sync.Mutex
		stop atomic.Bool
		wg   sync.WaitGroup
	)
	wg.Go(func() { // orders all along, some cancelled at once
		for i := 0; !stop.Load(); i++ {
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
			id := body["order_id"].(string)
			mu.Lock()
			ids = append(ids, id)
			mu.Unlock()
			if i%3 == 0 {
				time.Sleep(time.Duration(rand.IntN(30)) * time.Millisecond)
				s.post("/v1/orders/"+id+"/cancel", nil)
			}
			time.Sleep(15 * time.Millisecond)
		}
	})

	ch := testenv.NewChannel(t, s.amqpURL)
	depth := func(queue string) int {
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		if err != nil {
			t.Fatalf("queue %s: %v", queue, err)
		}
		return q.Messages
	}
	retryDelays := []time.Duration{100 * time.Millisecond, 500 * time.Millisecond} // CONSUMER_RETRY_DELAYS of newSystem
	queuesAt := func(partitions int) []string {
		var qs []string
		for _, c := range consumer.All(consumer.Deps{}) {
			topo := inbox.Topology{Consumer: c.Name(), Partitions: partitions}
			qs = append(qs, topo.WorkQueues()...)
			if partitions == 0 {
				for _, d := range retryDelays {
					qs = append(qs, topo.RetryQueue(d))
				}
			}
		}
		return qs
	}
	change := func(from, to int, relay, cons string) (string, string) {
		// A backlog in the queues: the consumer stops first, for a while.
		s.stop(cons)
		time.Sleep(time.Second)
		s.stop(relay) // then the outbox holds what order-api writes
		time.Sleep(500 * time.Millisecond)
		s.env = append(s.env, fmt.Sprintf("MESSAGE_PARTITIONS=%d", from))
		drained := func() bool {
			for _, q := range queuesAt(from) {
				if depth(q) != 0 {
					return false
				}
			}
			return true
		}
		// A queue's depth counts the messages ready, not those a consumer
		// holds unacknowledged: the consumer stopped with some in hand
		// gives them back, and another one drains again until stopping
		// leaves the queues empty.
		for round := 1; round == 1 || !drained(); round++ {
			drain := fmt.Sprintf("%s-drain-%d", cons, round)
			s.startConsumer(drain)
			for settled := false; !settled; settled = drained() {
				testenv.WaitFor(t, 60*time.Second, fmt.Sprintf("the queues at %d partitions to drain", from), drained)
				time.Sleep(2 * time.Second)
			}
			s.stop(drain)
		}
		s.env = append(s.env, fmt.Sprintf("MESSAGE_PARTITIONS=%d", to))
		next := fmt.Sprintf("consumer-p%d", to)
		s.startConsumer(next)
		for _, q := range queuesAt(from) {
			if slices.Contains(queuesAt(to), q) {
				continue
			}
			if n := depth(q); n != 0 {
				t.Fatalf("%s holds %d messages after the drain", q, n)
			}
			if _, err := ch.QueueDelete(q, false, false, false); err != nil { // quorum queues have no if-empty
				t.Fatalf("delete %s: %v", q, err)
			}
		}
		return s.startRelay(fmt.Sprintf("relay-p%d", to)), next
	}

	time.Sleep(2 * time.Second)
	_, cons := change(0, 8, "relay-a", "consumer-a")
	time.Sleep(2 * time.Second)
	change(8, 4, "relay-p8", cons)
	time.Sleep(2 * time.Second)
	stop.Store(true)
	wg.Wait()
	if t.Failed() {
		return
	}

	conn, err := pgx.Connect(context.Background(), s.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	testenv.WaitFor(t, 90*time.Second, "every order to be final", func() bool {
		var open int
		_ = conn.QueryRow(context.Background(), `SELECT count(*) FROM orders WHERE status NOT IN ('FULFILLED', 'REJECTED', 'CANCELLED')`).Scan(&open)
		return open == 0
	})
	t.Logf("%d orders through 0, 8 and 4 partitions", len(ids))
	checkEachOrderInOrder(t, conn, ids)
}
