package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/yourorg/orders/internal/consumer/consumertest"
	"github.com/yourorg/orders/internal/consumer/shipping"
	"github.com/yourorg/orders/internal/domain"
	"github.com/yourorg/orders/internal/messaging/inbox"
	"github.com/yourorg/orders/internal/testenv"
)

// The crash-after-commit fault exits (here: calls the stand-in, and cuts
// the broker connection as the process's death would) right after the
// commit of the next delivery of its type, once, without the ack; the
// redelivery is a duplicate, and the effect exists once.
func TestCrashAfterCommitFault(t *testing.T) {
	t.Parallel()
	h := consumertest.Start(t)
	proxy := testenv.NewProxy(t, testenv.HostPort(h.AMQPURL))
	exited := make(chan int, 1)
	crash := &crashAfterCommit{log: testenv.Logger(), exit: func(code int) {
		exited <- code
		proxy.Cut()
		go func() { time.Sleep(300 * time.Millisecond); proxy.Restore() }()
	}}
	cfg := consumertest.Config()
	cfg.Faults = crash
	h.RunOn(cfg, h.DBURL, proxy.Rewrite(h.AMQPURL), h.Metrics, shipping.New())

	arm := func(body string) int {
		rec := httptest.NewRecorder()
		crash.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/faults/crash-after-commit", strings.NewReader(body)))
		return rec.Code
	}
	if code := arm(`{"message_type":"order.exploded"}`); code != http.StatusBadRequest {
		t.Fatalf("arming an unknown type: %d, want 400", code)
	}
	if code := arm(`{"message_type":"` + domain.TypeOrderFulfilled + `"}`); code != http.StatusAccepted {
		t.Fatalf("arming: %d, want 202", code)
	}
	order := testenv.NewID()
	id := h.Deliver(domain.OrderFulfilledV1{ID: order})
	if code := <-exited; code != 3 {
		t.Fatalf("exit code %d", code)
	}
	h.WaitDuplicates(1)
	if row := h.WaitDone(shipping.Name, id); row.Status != inbox.StatusProcessed {
		t.Fatalf("inbox row %+v", row)
	}
	if n := h.Count("SELECT count(*) FROM shipment WHERE order_id = $1", order); n != 1 {
		t.Fatalf("%d shipments", n)
	}

	other := h.Deliver(domain.OrderFulfilledV1{ID: testenv.NewID()}) // disarmed: acked normally
	h.WaitDone(shipping.Name, other)
	select {
	case <-exited:
		t.Fatal("the fault fired twice")
	case <-time.After(300 * time.Millisecond):
	}
}
