package notification_test

import (
	"io"
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
	"github.com/yourorg/orders/internal/messaging/inbox/inboxadmin"
	"github.com/yourorg/orders/internal/testenv"
)

// The failure windows of the two-step external call; each test here fails
// without the mechanism it names.

// call is one webhook call as the receiver saw it.
type call struct {
	key        string
	start, end time.Time
}

// receiver records every call, deduplicates notifications on their
// Idempotency-Key, and answers each call as answer says.
type receiver struct {
	mu      sync.Mutex
	calls   []*call
	started chan int // the number of each call, as it starts
	answer  func(n int, r *http.Request) int
}

func newReceiver(t *testing.T, answer func(n int, r *http.Request) int) (*receiver, *httptest.Server) {
	rc := &receiver{started: make(chan int, 16), answer: answer}
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		c := &call{key: r.Header.Get(notification.HeaderIdempotencyKey), start: time.Now()}
		// With the body read, the server notices a client that gives up:
		// r.Context() ends.
		_, _ = io.Copy(io.Discard, r.Body)
		rc.mu.Lock()
		rc.calls = append(rc.calls, c)
		n := len(rc.calls)
		rc.mu.Unlock()
		rc.started <- n
		status := rc.answer(n, r)
		rc.mu.Lock()
		c.end = time.Now()
		rc.mu.Unlock()
		rw.WriteHeader(status)
	}))
	t.Cleanup(srv.Close)
	return rc, srv
}

func (rc *receiver) snapshot() []call {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	out := make([]call, len(rc.calls))
	for i, c := range rc.calls {
		out[i] = *c
	}
	return out
}

func (rc *receiver) waitStart(t *testing.T, n int) {
	t.Helper()
	select {
	case got := <-rc.started:
		if got != n {
			t.Fatalf("webhook call %d started, want %d", got, n)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("webhook call %d never started", n)
	}
}

// notificationRow reads the notification of an order: status, attempts
// recorded, last error.
func notificationRow(t *testing.T, h *consumertest.Harness, order uuid.UUID) (status string, attempts int, lastError string) {
	t.Helper()
	var lastErr *string
	if err := h.Pool.QueryRow(h.Ctx, "SELECT status, attempt_count, last_error FROM customer_notification WHERE order_id = $1", order).
		Scan(&status, &attempts, &lastErr); err != nil {
		t.Fatal(err)
	}
	if lastErr != nil {
		lastError = *lastErr
	}
	return status, attempts, lastError
}

// The webhook takes the notification but answers after the client's
// timeout: the outcome is unknown to the consumer. The retry carries the
// same Idempotency-Key, so the receiver recognises it, and the
// notification ends SENT, once.
func TestWebhookTimeoutRetriesWithTheSameKey(t *testing.T) {
	t.Parallel()
	rc, srv := newReceiver(t, func(n int, r *http.Request) int {
		if n == 1 { // recorded, answered too late
			select {
			case <-r.Context().Done():
			case <-time.After(5 * time.Second):
			}
		}
		return http.StatusOK
	})
	h := consumertest.Start(t, notification.New(notification.Config{URL: srv.URL, Timeout: 300 * time.Millisecond}))
	order := uuid.New()
	id := h.Deliver(domain.OrderCancelledV1{ID: order})
	if row := h.WaitDone(notification.Name, id); row.Status != inbox.StatusProcessed {
		t.Fatalf("inbox row %+v, want PROCESSED", row)
	}
	calls := rc.snapshot()
	if len(calls) != 2 || calls[0].key == "" || calls[0].key != calls[1].key {
		t.Fatalf("webhook calls %+v; want two with one Idempotency-Key", calls)
	}
	if status, attempts, _ := notificationRow(t, h, order); status != "SENT" || attempts != 2 {
		t.Fatalf("notification %s after %d attempts; want SENT after 2", status, attempts)
	}
	if n := h.Count("SELECT count(*) FROM customer_notification WHERE order_id = $1", order); n != 1 {
		t.Fatalf("%d notifications for the order", n)
	}
}

// A webhook call outlives the processing lease (the receiver hangs), and
// the original delivery's second step is late (its database is away for a
// while). Meanwhile a redelivery of the message takes it over after the
// lease and calls again. The two calls never overlap; the late original,
// fenced out by its attempt (inbox.Fence), records nothing, neither while
// the takeover is between its steps nor after; the notification ends SENT
// once and is not flipped back.
func TestTakeoverNeverOverlapsTheLateOriginal(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	var once sync.Once
	rc, srv := newReceiver(t, func(n int, r *http.Request) int {
		if n == 1 {
			select { // hangs until the client gives up
			case <-r.Context().Done():
			case <-time.After(30 * time.Second):
			}
			return http.StatusOK
		}
		select { // the takeover's call, held until the test has looked
		case <-release:
		case <-r.Context().Done():
		}
		return http.StatusOK
	})
	t.Cleanup(func() { once.Do(func() { close(release) }) }) // before the server's Close

	h := consumertest.Start(t)
	cfg := consumertest.Config()
	cfg.ProcessingLease, cfg.TxTimeout = 5*time.Second, time.Second
	notifier := notification.Config{URL: srv.URL, Timeout: 4 * time.Second}
	// The original: one delivery at a time, its database behind a proxy.
	proxy := testenv.NewProxy(t, testenv.HostPort(h.DBURL))
	original := cfg
	original.Workers, original.Prefetch = 1, 1
	originalMetrics := testenv.NewMetrics()
	h.Run(original, proxy.Rewrite(h.DBURL), originalMetrics, notification.New(notifier))
	order := uuid.New()
	id := h.Deliver(domain.OrderCancelledV1{ID: order})
	rc.waitStart(t, 1)
	proxy.Stall() // the original's second step waits for its database

	// The takeover: another consumer, the same message again.
	h.Run(cfg, h.DBURL, h.Metrics, notification.New(notifier))
	h.Redeliver(id)
	rc.waitStart(t, 2)
	proxy.Heal()
	testenv.WaitFor(t, 30*time.Second, "the late original to stand down", func() bool {
		return originalMetrics.Counter(t, "consumer.messages.duplicates") == 1
	})
	row, err := inboxadmin.Get(h.Ctx, h.Pool, notification.Name, id)
	if err != nil {
		t.Fatal(err)
	}
	status, attempts, lastError := notificationRow(t, h, order)
	if row.Status != inbox.StatusProcessing || row.Attempts != 2 || status != "PENDING" || attempts != 0 || lastError != "" {
		t.Fatalf("after the late original: inbox %+v, notification %s, %d attempts recorded, last error %q; "+
			"want the takeover's PROCESSING row untouched and nothing recorded", row, status, attempts, lastError)
	}

	once.Do(func() { close(release) })
	if row := h.WaitDone(notification.Name, id); row.Status != inbox.StatusProcessed || row.Attempts != 2 {
		t.Fatalf("inbox row %+v, want PROCESSED by the takeover", row)
	}
	if status, attempts, lastError := notificationRow(t, h, order); status != "SENT" || attempts != 1 || lastError != "" {
		t.Fatalf("notification %s, %d attempts recorded, last error %q; want SENT by the takeover alone", status, attempts, lastError)
	}
	calls := rc.snapshot()
	if len(calls) != 2 || calls[0].key != calls[1].key {
		t.Fatalf("webhook calls %+v; want two with one Idempotency-Key", calls)
	}
	if calls[0].end.IsZero() || calls[0].end.After(calls[1].start) {
		t.Fatalf("the calls overlapped: the original's ended at %s, the takeover's started at %s",
			calls[0].end.Format(time.StampMicro), calls[1].start.Format(time.StampMicro))
	}
}
