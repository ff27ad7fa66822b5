package consumer_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/yourorg/orders/internal/consumer/notification"
	"github.com/yourorg/orders/internal/domain"
	"github.com/yourorg/orders/internal/messaging/inbox/inboxadmin"
	"github.com/yourorg/orders/internal/testenv"
)

// lockedBuffer is a log written from many goroutines.
type lockedBuffer struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// A webhook's URL is often its credential: a chat webhook's token in its
// path, a signature in its query. A receiver that drops every connection
// without an answer makes the HTTP client fail with an error that quotes
// the whole URL; none of the URL but its scheme and host may reach any
// place that error goes: the notification's last error, the inbox row's,
// the log lines, the customer's order page, and the spans (the client
// span's url.full, every status, attribute and event). What is stored is
// the error's code and the redacted URL.
func TestWebhookURLSecretsReachNoSink(t *testing.T) {
	t.Parallel()
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body) // all of it: a close with unread data would be a reset
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			_ = conn.Close()
		}
	}))
	t.Cleanup(receiver.Close)
	secrets := []string{"path-secret-T0K3N", "query-secret-S1G", "userinfo-secret-P4SS"}
	host := strings.TrimPrefix(receiver.URL, "http://")
	hook := "http://hook:" + secrets[2] + "@" + host + "/services/" + secrets[0] + "/notify?token=" + secrets[1] + "&v=1"

	recorder := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(recorder))
	t.Cleanup(func() { _ = tp.Shutdown(t.Context()) })
	logs := &lockedBuffer{}
	f := setup(t, options{webhook: hook, api: true, tracer: tp, logs: logs})
	o := f.createOrder("c")
	id := f.send(domain.SubmittedMessage(o), "c")
	testenv.WaitFor(t, 20*time.Second, "three calls of the webhook, each recorded", func() bool {
		return f.one("SELECT attempt_count::text FROM customer_notification WHERE order_id = $1", o.ID()) >= "3"
	})
	row, err := inboxadmin.Get(f.ctx, f.pool, notification.Name, id)
	if err != nil {
		t.Fatal(err)
	}

	redacted := "http://" + host + "/…"
	var sinks []string
	check := func(where, text string) {
		t.Helper()
		for _, secret := range secrets {
			if strings.Contains(text, secret) {
				t.Errorf("%s holds %q: %s", where, secret, text)
			}
		}
		sinks = append(sinks, text)
	}
	if row.LastErrorCode != "webhook_unavailable" || !strings.HasPrefix(row.LastErrorMessage, "webhook_unavailable: POST "+redacted+": ") {
		t.Errorf("inbox row %s, last error %s %q; want webhook_unavailable naming %s", row.Status, row.LastErrorCode, row.LastErrorMessage, redacted)
	}
	check("the inbox row's last error", row.LastErrorMessage)
	lastError := f.one("SELECT last_error FROM customer_notification WHERE order_id = $1", o.ID())
	if !strings.HasPrefix(lastError, "webhook_unavailable: POST "+redacted+": ") {
		t.Errorf("the notification's last error %q, want its code and %s", lastError, redacted)
	}
	check("the notification's last error", lastError)

	resp, err := http.Get(f.api.URL + "/ui/orders/" + o.ID().String())
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(page), "webhook_unavailable") {
		t.Errorf("the order page: %d, without the notification's error\n%s", resp.StatusCode, page)
	}
	check("the order page", string(page))

	if !strings.Contains(logs.String(), "webhook_unavailable") {
		t.Errorf("no log line says webhook_unavailable:\n%s", logs.String())
	}
	for line := range strings.Lines(logs.String()) {
		check("a log line", line)
	}

	clientSpans := 0
	for _, s := range recorder.Ended() {
		var text strings.Builder
		text.WriteString(s.Name() + " " + s.Status().Description)
		for _, a := range s.Attributes() {
			text.WriteString(" " + string(a.Key) + "=" + a.Value.String())
			if a.Key == "url.full" {
				clientSpans++
				if a.Value.AsString() != redacted {
					t.Errorf("a span's url.full is %q, want %q", a.Value.AsString(), redacted)
				}
			}
		}
		for _, e := range s.Events() {
			text.WriteString(" " + e.Name)
			for _, a := range e.Attributes {
				text.WriteString(" " + string(a.Key) + "=" + a.Value.String())
			}
		}
		check("span "+s.Name(), text.String())
	}
	if clientSpans == 0 {
		t.Errorf("no client span of the webhook calls (url.full) among %d spans", len(recorder.Ended()))
	}
}
