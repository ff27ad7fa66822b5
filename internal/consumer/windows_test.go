package consumer_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/yourorg/orders/internal/consumer"
	"github.com/yourorg/orders/internal/testenv"
)

// The broker goes away under a steady load, again and again (as a restart
// or a failover looks to the clients: every connection of the relay and of
// the consumers cut, new ones refused for a while; the shared broker itself
// is left alone). Every order reaches its final status with one transition
// per step, every published message reached every consumer that reads its
// type, and nothing was applied twice.
func TestBrokerGoneUnderLoad(t *testing.T) {
	t.Parallel()
	f := setup(t, options{relay: true, proxy: true})
	var (
		mu     sync.Mutex
		orders []uuid.UUID
		wg     sync.WaitGroup
	)
	stop := make(chan struct{})
	wg.Go(func() { // a steady load: an order every 20 ms
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			o := f.createOrder("load")
			mu.Lock()
			orders = append(orders, o.ID())
			mu.Unlock()
		}
	})
	for range 3 {
		time.Sleep(time.Second) // orders flow
		f.proxy.Cut()
		time.Sleep(2 * time.Second) // the broker is away; orders keep coming
		f.proxy.Restore()
	}
	time.Sleep(time.Second)
	close(stop)
	wg.Wait()

	// A backlog of three hops per order, on a busy machine: wait generously.
	testenv.WaitFor(t, 3*time.Minute, "every order to be FULFILLED", func() bool {
		return f.one("SELECT count(*)::text FROM orders WHERE status <> 'FULFILLED'") == "0"
	})
	for _, id := range orders {
		if h := fmt.Sprint(f.transitions(id)); h != "[>SUBMITTED SUBMITTED>FULFILLMENT_REQUESTED FULFILLMENT_REQUESTED>FULFILLED]" {
			t.Fatalf("order %s: history %s", id, h)
		}
	}
	// An order is FULFILLED before its order.fulfilled is published and
	// read: wait for the flow to settle, then say what never did.
	var unsettled []string
	deadline := time.Now().Add(time.Minute)
	for {
		unsettled = nil
		if n := f.one("SELECT count(*)::text FROM message_outbox WHERE status <> 'PUBLISHED'"); n != "0" {
			unsettled = append(unsettled, n+" outbox rows not PUBLISHED")
		}
		for _, c := range consumer.All(consumer.Deps{}) {
			lost := f.one(`SELECT count(*)::text FROM message_outbox o WHERE message_type = ANY($2)
				AND NOT EXISTS (SELECT 1 FROM message_inbox i WHERE i.consumer_name = $1 AND i.message_id = o.outbox_id::text)`, c.Name(), c.Types())
			if lost != "0" {
				unsettled = append(unsettled, fmt.Sprintf("%s never received %s published messages", c.Name(), lost))
			}
		}
		if n := f.one("SELECT count(*)::text FROM message_inbox WHERE status <> 'PROCESSED'"); n != "0" {
			unsettled = append(unsettled, n+" inbox rows not PROCESSED")
		}
		if len(unsettled) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, u := range unsettled {
		t.Error(u)
	}
	if n := f.one("SELECT count(*)::text FROM (SELECT 1 FROM message_outbox GROUP BY aggregate_id, message_type HAVING count(*) > 1) t"); n != "0" {
		t.Fatalf("%s (order, message type) pairs emitted twice", n)
	}
	t.Logf("%d orders through 3 broker outages", len(orders))
}
