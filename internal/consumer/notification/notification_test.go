package notification_test

import (
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/yourorg/orders/internal/consumer/consumertest"
	"github.com/yourorg/orders/internal/consumer/notification"
	"github.com/yourorg/orders/internal/domain"
	"github.com/yourorg/orders/internal/messaging/inbox"
)

// webhook records the Idempotency-Key of every call.
type webhook struct {
	mu   sync.Mutex
	keys []string
}

func (w *webhook) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.keys = append(w.keys, r.Header.Get(notification.HeaderIdempotencyKey))
	rw.WriteHeader(http.StatusNoContent)
}

func (w *webhook) calls() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.keys...)
}

// One notification per (order, kind), delivered once: the message again
// is a duplicate, and another message of the same kind for the same order
// is ignored; neither calls the webhook a second time.
func TestOneNotificationPerOrderAndKind(t *testing.T) {
	t.Parallel()
	hook := &webhook{}
	srv := httptest.NewServer(hook)
	t.Cleanup(srv.Close)
	h := consumertest.Start(t, notification.New(notification.Config{URL: srv.URL, Timeout: time.Second}))
	order := uuid.New()

	first := h.Deliver(domain.OrderCancelledV1{ID: order})
	if row := h.WaitDone(notification.Name, first); row.Status != inbox.StatusProcessed {
		t.Fatalf("inbox row %+v, want PROCESSED", row)
	}
	var id, status string
	if err := h.Pool.QueryRow(h.Ctx, "SELECT notification_id::text, status FROM customer_notification WHERE order_id = $1 AND kind = 'order_cancelled'", order).
		Scan(&id, &status); err != nil {
		t.Fatal(err)
	}
	if calls := hook.calls(); status != "SENT" || len(calls) != 1 || calls[0] != id {
		t.Fatalf("notification %s, webhook calls %v; want SENT, one call keyed %s", status, calls, id)
	}

	h.Redeliver(first)
	h.WaitDuplicates(1)
	again := h.Deliver(domain.OrderCancelledV1{ID: order})
	if row := h.WaitDone(notification.Name, again); row.Outcome != inbox.OutcomeIgnored {
		t.Fatalf("a second order.cancelled for the order: %+v, want IGNORED", row)
	}
	if calls := hook.calls(); len(calls) != 1 {
		t.Fatalf("webhook called %d times, want once", len(calls))
	}
}

// Without a webhook URL, notifications are recorded as SKIPPED.
func TestNoWebhookSkips(t *testing.T) {
	t.Parallel()
	h := consumertest.Start(t, notification.New(notification.Config{}))
	order := uuid.New()
	h.WaitDone(notification.Name, h.Deliver(domain.OrderFulfilledV1{ID: order}))
	if n := h.Count("SELECT count(*) FROM customer_notification WHERE order_id = $1 AND status = 'SKIPPED'", order); n != 1 {
		t.Fatalf("%d SKIPPED notifications, want 1", n)
	}
}

// A webhook that redirects is not followed: the client would turn the POST
// into a GET (301, 302, 303), or post the notification to an address
// nobody configured. The redirect is the receiver's refusal: permanent,
// parked after one call.
func TestWebhookRedirectIsNotFollowed(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var paths []string
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		paths = append(paths, r.Method+" "+r.URL.Path)
		mu.Unlock()
		if r.URL.Path == "/hook" {
			http.Redirect(w, r, "/elsewhere", http.StatusFound)
		}
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	h := consumertest.Start(t, notification.New(notification.Config{URL: srv.URL + "/hook", Timeout: time.Second}))
	row := h.WaitDone(notification.Name, h.Deliver(domain.OrderCancelledV1{ID: uuid.New()}))
	mu.Lock()
	defer mu.Unlock()
	if row.Status != inbox.StatusPermanentFailed || row.LastErrorCode != "webhook_rejected" || len(paths) != 1 || paths[0] != "POST /hook" {
		t.Fatalf("inbox row %s %s %q, calls %v; want PERMANENT_FAILED webhook_rejected after one POST /hook", row.Status, row.LastErrorCode, row.LastErrorMessage, paths)
	}
}
