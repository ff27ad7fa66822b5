package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/yourorg/orders/internal/testenv"
)

const noteBody = `{"notification_id":"n-1","order_id":"o-1","kind":"order_received","message_id":"m-1"}`

// syncBuffer is a bytes.Buffer safe for the logger and the test at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// newTestServer returns the handler and its JSON log.
func newTestServer(failFirst int) (http.Handler, *syncBuffer) {
	logs := &syncBuffer{}
	return newServer(failFirst, slog.New(slog.NewJSONHandler(logs, nil))), logs
}

// post sends a notification to h; an empty key sends no Idempotency-Key.
func post(t *testing.T, h http.Handler, key, body string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequestWithContext(t.Context(), http.MethodPost, "/notifications", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set(headerIdempotencyKey, key)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// list returns what GET /notifications answers.
func list(t *testing.T, h http.Handler) []received {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequestWithContext(t.Context(), http.MethodGet, "/notifications", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("GET /notifications: %d %s", rec.Code, rec.Body)
	}
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Fatalf("GET /notifications: Content-Type %q", ct)
	}
	var got []received
	if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
		t.Fatalf("GET /notifications: %v: %s", err, rec.Body)
	}
	return got
}

func wantStatus(t *testing.T, rec *httptest.ResponseRecorder, want int) {
	t.Helper()
	if rec.Code != want {
		t.Fatalf("status %d, want %d: %s", rec.Code, want, rec.Body)
	}
}

// The same key twice is recorded once; the second answer says it is a replay.
func TestSameKeyTwice(t *testing.T) {
	t.Parallel()
	h, logs := newTestServer(0)

	first := post(t, h, "k-1", noteBody)
	wantStatus(t, first, http.StatusOK)
	if got := first.Header().Get(headerReplayed); got != "" {
		t.Errorf("first answer: %s: %q, want none", headerReplayed, got)
	}
	second := post(t, h, "k-1", noteBody)
	wantStatus(t, second, http.StatusOK)
	if got := second.Header().Get(headerReplayed); got != "true" {
		t.Errorf("second answer: %s: %q, want true", headerReplayed, got)
	}

	got := list(t, h)
	if len(got) != 1 {
		t.Fatalf("recorded %d notifications, want 1: %+v", len(got), got)
	}
	if n := got[0]; n.IdempotencyKey != "k-1" || n.OrderID != "o-1" || n.Kind != "order_received" ||
		n.NotificationID != "n-1" || n.MessageID != "m-1" || n.Requests != 2 {
		t.Errorf("recorded %+v", n)
	}
	for _, msg := range []string{`"msg":"notification received"`, `"msg":"duplicate notification ignored"`} {
		if !strings.Contains(logs.String(), msg) {
			t.Errorf("log has no %s:\n%s", msg, logs)
		}
	}
	if !strings.Contains(logs.String(), `"order_id":"o-1","kind":"order_received","idempotency_key":"k-1"`) {
		t.Errorf("log does not name the order, kind and key:\n%s", logs)
	}
}

func TestMissingKey(t *testing.T) {
	t.Parallel()
	h, _ := newTestServer(0)
	wantStatus(t, post(t, h, "", noteBody), http.StatusBadRequest)
	if got := list(t, h); len(got) != 0 {
		t.Errorf("recorded %+v", got)
	}
}

func TestBadJSON(t *testing.T) {
	t.Parallel()
	h, _ := newTestServer(0)
	for _, body := range []string{"", "not json", `{"order_id":`, `[1,2]`, noteBody + "trailing"} {
		wantStatus(t, post(t, h, "k-bad", body), http.StatusBadRequest)
	}
	if got := list(t, h); len(got) != 0 {
		t.Errorf("recorded %+v", got)
	}
	// A bad body does not burn the key: the good one is recorded.
	wantStatus(t, post(t, h, "k-bad", noteBody), http.StatusOK)
	if got := list(t, h); len(got) != 1 {
		t.Errorf("recorded %+v, want one", got)
	}
}

// FAIL_FIRST=2: each new key gets 503 twice, then its retry is recorded.
func TestFailFirst(t *testing.T) {
	t.Parallel()
	h, logs := newTestServer(2)

	for _, key := range []string{"k-a", "k-b"} {
		wantStatus(t, post(t, h, key, noteBody), http.StatusServiceUnavailable)
		wantStatus(t, post(t, h, key, noteBody), http.StatusServiceUnavailable)
		rec := post(t, h, key, noteBody)
		wantStatus(t, rec, http.StatusOK)
		if got := rec.Header().Get(headerReplayed); got != "" {
			t.Errorf("%s: %s: %q on the first 200", key, headerReplayed, got)
		}
		// Once recorded, the key is a replay, never a 503 again.
		rec = post(t, h, key, noteBody)
		wantStatus(t, rec, http.StatusOK)
		if got := rec.Header().Get(headerReplayed); got != "true" {
			t.Errorf("%s: %s: %q after the first 200", key, headerReplayed, got)
		}
	}

	got := list(t, h)
	if len(got) != 2 || got[0].IdempotencyKey != "k-a" || got[1].IdempotencyKey != "k-b" {
		t.Fatalf("recorded %+v, want k-a then k-b", got)
	}
	for _, n := range got {
		if n.Requests != 4 {
			t.Errorf("%s: %d requests, want 4", n.IdempotencyKey, n.Requests)
		}
	}
	if c := strings.Count(logs.String(), `"msg":"notification received"`); c != 2 {
		t.Errorf("%d notification received lines, want 2:\n%s", c, logs)
	}
}

// GET /notifications lists what was recorded, oldest first; [] when empty.
func TestListNotifications(t *testing.T) {
	t.Parallel()
	h, _ := newTestServer(0)

	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequestWithContext(t.Context(), http.MethodGet, "/notifications", nil))
	if body := strings.TrimSpace(rec.Body.String()); body != "[]" {
		t.Errorf("empty list: %s, want []", body)
	}

	before := time.Now().UTC().Add(-time.Second)
	wantStatus(t, post(t, h, "k-1", `{"notification_id":"n-1","order_id":"o-1","kind":"order_received","message_id":"m-1"}`), http.StatusOK)
	wantStatus(t, post(t, h, "k-2", `{"notification_id":"n-2","order_id":"o-1","kind":"order_fulfilled","message_id":"m-2"}`), http.StatusOK)
	wantStatus(t, post(t, h, "k-1", `{"notification_id":"n-1","order_id":"o-1","kind":"order_received","message_id":"m-1"}`), http.StatusOK)

	got := list(t, h)
	if len(got) != 2 {
		t.Fatalf("recorded %+v, want 2", got)
	}
	for i, want := range []received{
		{IdempotencyKey: "k-1", NotificationID: "n-1", OrderID: "o-1", Kind: "order_received", MessageID: "m-1", Requests: 2},
		{IdempotencyKey: "k-2", NotificationID: "n-2", OrderID: "o-1", Kind: "order_fulfilled", MessageID: "m-2", Requests: 1},
	} {
		if got[i].ReceivedAt.Before(before) {
			t.Errorf("%d: received_at %v", i, got[i].ReceivedAt)
		}
		got[i].ReceivedAt = time.Time{}
		if got[i] != want {
			t.Errorf("%d: %+v, want %+v", i, got[i], want)
		}
	}
}

func TestHealthzAndMethods(t *testing.T) {
	t.Parallel()
	h, _ := newTestServer(0)
	for _, tc := range []struct {
		method, path string
		want         int
	}{
		{http.MethodGet, "/healthz", http.StatusOK},
		{http.MethodDelete, "/notifications", http.StatusMethodNotAllowed},
		{http.MethodGet, "/nowhere", http.StatusNotFound},
	} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequestWithContext(t.Context(), tc.method, tc.path, nil))
		if rec.Code != tc.want {
			t.Errorf("%s %s: %d, want %d", tc.method, tc.path, rec.Code, tc.want)
		}
	}
}

// Concurrent retries of one key record it once (run with -race).
func TestConcurrentSameKey(t *testing.T) {
	t.Parallel()
	h, _ := newTestServer(1)
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			req := httptest.NewRequestWithContext(context.WithoutCancel(t.Context()), http.MethodPost, "/notifications", strings.NewReader(noteBody))
			req.Header.Set(headerIdempotencyKey, "k-1")
			h.ServeHTTP(httptest.NewRecorder(), req)
		})
	}
	wg.Wait()
	if got := list(t, h); len(got) != 1 || got[0].Requests != 20 {
		t.Errorf("recorded %+v, want one with 20 requests", got)
	}
}

func env(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestRunRejectsBadFailFirst(t *testing.T) {
	t.Parallel()
	for _, v := range []string{"x", "-1", "1.5"} {
		err := run(t.Context(), env(map[string]string{"FAIL_FIRST": v}), io.Discard)
		if err == nil || !strings.Contains(err.Error(), "FAIL_FIRST") {
			t.Errorf("FAIL_FIRST=%s: %v, want an error naming FAIL_FIRST", v, err)
		}
	}
}

// run listens, and returns nil once its context is done (SIGTERM in main).
func TestRunShutsDown(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	logs := &syncBuffer{}
	errc := make(chan error, 1)
	go func() { errc <- run(ctx, env(map[string]string{"WEBHOOK_ADDR": "127.0.0.1:0"}), logs) }()

	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(logs.String(), `"msg":"listening"`) {
		select {
		case err := <-errc:
			t.Fatalf("run returned before listening: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("not listening after 5s:\n%s", logs)
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	select {
	case err := <-errc:
		if err != nil {
			t.Fatalf("run: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("run did not return 5s after its context was cancelled")
	}
	if !strings.Contains(logs.String(), `"msg":"stopped"`) {
		t.Errorf("no stopped line:\n%s", logs)
	}
}

// LOG_FORMAT=text gives text lines, as in the other binaries; a format it
// does not know stops it at start, naming the variable.
func TestLogFormat(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	logs := &syncBuffer{}
	errc := make(chan error, 1)
	go func() {
		errc <- run(ctx, env(map[string]string{"WEBHOOK_ADDR": "127.0.0.1:0", "LOG_FORMAT": "text"}), logs)
	}()
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(logs.String(), "msg=listening") {
		select {
		case err := <-errc:
			t.Fatalf("run returned before listening: %v\n%s", err, logs)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no text line msg=listening after 5s:\n%s", logs)
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-errc; err != nil {
		t.Fatalf("run: %v", err)
	}
	if strings.Contains(logs.String(), `"msg":`) || !strings.Contains(logs.String(), "service=webhook-receiver") {
		t.Errorf("want text lines with the service name:\n%s", logs)
	}

	for variable, value := range map[string]string{"LOG_FORMAT": "xml", "LOG_LEVEL": "loud"} {
		// Should the value be let through, run serves until this ends.
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		err := run(ctx, env(map[string]string{variable: value, "WEBHOOK_ADDR": "127.0.0.1:0"}), io.Discard)
		cancel()
		if err == nil || !strings.Contains(err.Error(), variable) {
			t.Errorf("%s=%s: %v, want an error naming %s", variable, value, err, variable)
		}
	}
}

// The healthcheck sub-command, docker compose's health check, succeeds
// once a receiver listens on WEBHOOK_ADDR, and fails before and after.
func TestHealthcheck(t *testing.T) {
	t.Parallel()
	getenv := env(map[string]string{"WEBHOOK_ADDR": testenv.FreeAddr(t)})
	if err := healthcheck(t.Context(), getenv, io.Discard); err == nil {
		t.Fatal("healthcheck succeeded with no receiver listening")
	}
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() { errc <- run(ctx, getenv, io.Discard) }()
	testenv.WaitFor(t, 5*time.Second, "healthcheck to succeed", func() bool {
		return healthcheck(t.Context(), getenv, io.Discard) == nil
	})
	cancel()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if err := healthcheck(t.Context(), getenv, io.Discard); err == nil {
		t.Fatal("healthcheck succeeded after the receiver stopped")
	}
}
