package httpapi_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"golang.org/x/net/html"

	"github.com/yourorg/orders/api/apicheck"
	"github.com/yourorg/orders/internal/auth"
	"github.com/yourorg/orders/internal/consumer"
	"github.com/yourorg/orders/internal/consumer/notification"
	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/httpapi"
	"github.com/yourorg/orders/internal/messaging"
	"github.com/yourorg/orders/internal/messaging/inbox"
	"github.com/yourorg/orders/internal/messaging/outbox"
	"github.com/yourorg/orders/internal/testenv"
	"github.com/yourorg/orders/migrations"
)

// The browser tests drive Debian's chromium (apt-get install chromium) in
// headless mode. They skip, saying so, only where it is not installed;
// .ci/run installs it.

// The window of the screenshot.
const windowWidth, windowHeight = 1280, 900

// chromium returns the path of the browser. Without one the test is
// skipped on a laptop, and fails in CI (CI set, as .ci/run runs), which
// installs it: the browser check must not vanish there unnoticed.
func chromium(t *testing.T) string {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("chromium is not installed, and CI must check the page in a browser (.ci/run installs it)")
		}
		t.Skip("chromium is not installed (apt-get install chromium): the page is not checked in a browser")
	}
	return path
}

// browse runs headless chromium on url with the extra flags (--dump-dom,
// --screenshot=...) and returns what it printed on stdout.
func browse(t *testing.T, browser, url string, flags ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	args := append([]string{
		"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--hide-scrollbars", "--user-data-dir=" + t.TempDir(),
	}, flags...)
	cmd := exec.CommandContext(ctx, browser, append(args, url)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("chromium %v: %v\n%s", flags, err, stderr.String())
	}
	return stdout.Bytes()
}

// flowBundle is the order service in this process, on one database and
// vhost: the API, a relay, every consumer, and a webhook receiver that
// refuses the first call of each notification.
type flowBundle struct {
	api  *httptest.Server
	pool *pgxpool.Pool
	// operator is an operator's token for the API.
	operator string
	// browser is the API as a browser signed in at /ui/login reaches it:
	// every request carries the sign-in cookie, which chromium's command
	// line cannot set.
	browser *httptest.Server
}

func startFlow(t *testing.T) *flowBundle {
	t.Helper()
	db := testenv.NewDatabase(t, migrations.Schemas...)
	amqpURL := testenv.NewVhost(t)
	tp := sdktrace.NewTracerProvider() // real trace ids, exported nowhere
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))

	var mu sync.Mutex
	seen := map[string]bool{}
	webhook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		key := r.Header.Get("Idempotency-Key")
		if !seen[key] {
			seen[key] = true
			http.Error(w, "try again", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(webhook.Close)

	// Each component connects as its process's role.
	connect := func(role string) *pgxpool.Pool {
		pool, err := database.NewPool(t.Context(), database.PoolConfig{URL: db.URLAs(role)})
		if err != nil {
			t.Fatal(err)
		}
		return pool
	}
	run := func(role string, build func(pool *pgxpool.Pool) (run, ready func(context.Context) error)) {
		pool := connect(role)
		runFn, ready := build(pool)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = runFn(ctx) }()
		t.Cleanup(func() { cancel(); <-done; pool.Close() })
		testenv.WaitFor(t, 15*time.Second, "a component to be ready", func() bool { return ready(t.Context()) == nil })
	}
	run(migrations.RoleConsumer, func(pool *pgxpool.Pool) (func(context.Context) error, func(context.Context) error) {
		cs, err := inbox.NewConsumers(consumer.Inbox(inbox.Config{
			Prefetch: 8, Workers: 4, MaxAttempts: 4,
			RetryDelays:     []time.Duration{50 * time.Millisecond, 100 * time.Millisecond},
			ProcessingLease: 2 * time.Second, ShutdownTimeout: 2 * time.Second,
		}), messaging.Deps{Pool: pool, AMQPURL: amqpURL, Logger: logger, MeterProvider: metricnoop.NewMeterProvider(), TracerProvider: tp},
			consumer.All(consumer.Deps{
				Notifier:      notification.Config{URL: webhook.URL, Timeout: 5 * time.Second, TracerProvider: tp},
				MeterProvider: metricnoop.NewMeterProvider(),
			})...)
		if err != nil {
			t.Fatal(err)
		}
		return cs.Run, cs.Ready
	})
	run(migrations.RoleRelay, func(pool *pgxpool.Pool) (func(context.Context) error, func(context.Context) error) {
		r, err := outbox.NewRelay(outbox.Config{PollInterval: 50 * time.Millisecond, BackoffBase: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond},
			messaging.Deps{Pool: pool, AMQPURL: amqpURL, Logger: logger, MeterProvider: metricnoop.NewMeterProvider(), TracerProvider: tp})
		if err != nil {
			t.Fatal(err)
		}
		return r.Run, r.Ready
	})
	apiPool := connect(migrations.RoleAPI)
	t.Cleanup(apiPool.Close)
	secret := []byte(rand.Text() + rand.Text())
	verifier, err := auth.NewVerifier(auth.Options{Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	handler, err := httpapi.New(httpapi.Config{IdempotencyKeyTTL: time.Hour, JaegerUIURL: "http://localhost:16686"}, httpapi.Deps{
		Verifier: verifier, Pool: apiPool, Logger: logger, TracerProvider: tp,
		MeterProvider: metricnoop.NewMeterProvider(), MetricsHandler: http.NotFoundHandler(),
	})
	if err != nil {
		t.Fatal(err)
	}
	api := httptest.NewServer(handler)
	t.Cleanup(api.Close)
	operator, err := auth.Mint(secret, auth.Principal{Subject: "operator-1", Role: auth.RoleOperator}, time.Hour, "", "")
	if err != nil {
		t.Fatal(err)
	}
	// The cookie POST /ui/login sets, on every request as a browser sends
	// it; what the browser asks for and gets is checked against the
	// OpenAPI document.
	target, _ := url.Parse(api.URL)
	browser := httptest.NewServer(&httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(target)
			r.Out.AddCookie(&http.Cookie{Name: "orders_ui_token", Value: operator})
		},
		Transport: apicheck.Transport(t, nil),
	})
	t.Cleanup(browser.Close)
	return &flowBundle{api: api, pool: db.Pool, operator: operator, browser: browser}
}

// settled reports whether the order's flow has come to rest: FULFILLED,
// every outbox row published, every message received by each consumer that
// reads it and processed, every notification sent.
func (f *flowBundle) settled(t *testing.T, orderID string) bool {
	t.Helper()
	readers := map[string]int{}
	for _, c := range consumer.All(consumer.Deps{}) {
		for _, typ := range c.Types() {
			readers[typ]++
		}
	}
	var status string
	var types []string
	var unpublished, processed, unprocessed, unsent int
	err := f.pool.QueryRow(t.Context(), `
		SELECT (SELECT status FROM orders WHERE order_id = $2::uuid),
		       (SELECT coalesce(array_agg(message_type), '{}') FROM message_outbox WHERE aggregate_id = $1),
		       (SELECT count(*) FROM message_outbox WHERE aggregate_id = $1 AND status <> 'PUBLISHED'),
		       (SELECT count(*) FROM message_inbox WHERE aggregate_id = $1 AND status = 'PROCESSED'),
		       (SELECT count(*) FROM message_inbox WHERE aggregate_id = $1 AND status <> 'PROCESSED'),
		       (SELECT count(*) FROM customer_notification WHERE order_id = $2::uuid AND status <> 'SENT')`, orderID, orderID).
		Scan(&status, &types, &unpublished, &processed, &unprocessed, &unsent)
	if err != nil {
		t.Fatal(err)
	}
	want := 0
	for _, typ := range types {
		want += readers[typ]
	}
	return status == "FULFILLED" && unpublished == 0 && unprocessed == 0 && unsent == 0 && processed == want
}

// hop is a hop of the timeline as chromium rendered it: statusChange is
// whether it is marked as a status change, and status the status badge
// it then shows; retried is its note of an error retried.
type hop struct {
	kind, actor, time, summary string
	statusChange               bool
	status, retried            string
}

// An order that went through the whole flow (API, relay, every consumer,
// the webhook), its timeline page rendered by headless chromium: the DOM
// it built leads with the order's journey (its statuses, the time to the
// final one, its messages), has every hop in time order with the status
// changes marked apart, says of each notification the webhook refused
// once that it was delivered on retry, and its screenshot is a page of the
// window's size with the page's structure in it. The whole page fits in
// little more than a screen.
func TestUIOrderTimelineInChromium(t *testing.T) {
	t.Parallel()
	browser := chromium(t)
	f := startFlow(t)

	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, f.api.URL+"/v1/orders",
		strings.NewReader(`{"customer_id":"c-browser","currency":"EUR","items":[{"sku":"BOOK-1","quantity":1,"unit_price_cents":1999}]}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+f.operator)
	resp, err := apicheck.Client(t).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	orderID := strings.TrimPrefix(resp.Header.Get("Location"), "/v1/orders/")
	if resp.StatusCode != http.StatusCreated || orderID == "" {
		t.Fatalf("POST /v1/orders: %d", resp.StatusCode)
	}
	testenv.WaitFor(t, 30*time.Second, "the order's flow to come to rest", func() bool { return f.settled(t, orderID) })
	var traceID string
	if err := f.pool.QueryRow(t.Context(), `SELECT headers->>'traceparent' FROM message_outbox
		WHERE aggregate_id = $1 AND message_type = 'order.submitted'`, orderID).Scan(&traceID); err != nil {
		t.Fatal(err)
	}
	traceID = strings.Split(traceID, "-")[1]
	url := f.browser.URL + "/ui/orders/" + orderID

	// The DOM chromium built.
	doc, err := html.Parse(bytes.NewReader(browse(t, browser, url, "--dump-dom")))
	if err != nil {
		t.Fatal(err)
	}
	if got := text(byID(doc, "order-status")); got != "FULFILLED" {
		t.Errorf("#order-status = %q, want FULFILLED", got)
	}
	if a := firstElement(byID(doc, "trace"), "a"); a == nil || attr(a, "href") != "http://localhost:16686/trace/"+traceID {
		t.Errorf("#trace does not link the trace %s to Jaeger", traceID)
	}
	var hops []hop
	walk(byID(doc, "timeline"), func(n *html.Node) {
		if n.Data == "li" && hasClass(n, "hop") {
			hops = append(hops, hop{kind: attr(n, "data-kind"), actor: attr(n, "data-actor"),
				time: text(byClass(n, "hop-time")), summary: text(byClass(n, "summary")),
				statusChange: hasClass(n, "status-change"), status: text(byClass(byClass(n, "hop-head"), "status")),
				retried: text(byClass(n, "retried-note"))})
		}
	})
	if len(hops) == 0 {
		t.Fatal("the timeline has no hops")
	}
	t.Logf("%d hops", len(hops))
	for _, h := range hops {
		t.Logf("  %s %-13s %-12s %s", h.time, h.kind, h.actor, h.summary)
	}
	if !slices.IsSortedFunc(hops, func(a, b hop) int { return strings.Compare(a.time, b.time) }) {
		t.Errorf("the hops are not in time order")
	}
	index := func(kind, actor, summary string) int {
		return slices.IndexFunc(hops, func(h hop) bool {
			return h.kind == kind && (actor == "" || h.actor == actor) && strings.HasPrefix(h.summary, summary)
		})
	}
	// Every message of the order published, then received by each
	// consumer that reads it, in that order.
	steps := [][3]string{{"transition", "order-api", "order created: SUBMITTED"}}
	readers := map[string][]string{}
	for _, c := range consumer.All(consumer.Deps{}) {
		for _, typ := range c.Types() {
			readers[typ] = append(readers[typ], c.Name())
		}
	}
	for _, typ := range []string{"order.submitted", "fulfillment.requested", "fulfillment.completed", "order.fulfilled"} {
		steps = append(steps, [3]string{"publish", "outbox-relay", "published " + typ})
		for _, name := range readers[typ] {
			if i, j := index("publish", "outbox-relay", "published "+typ), index("delivery", name, typ+": PROCESSED"); i < 0 || j < 0 || j < i {
				t.Errorf("%s: published at hop %d, received by %s at hop %d", typ, i, name, j)
			}
		}
	}
	steps = append(steps,
		[3]string{"transition", "", "SUBMITTED → FULFILLMENT_REQUESTED"},
		[3]string{"transition", "", "FULFILLMENT_REQUESTED → FULFILLED"})
	for _, s := range steps {
		if index(s[0], s[1], s[2]) < 0 {
			t.Errorf("no %s hop by %q: %q", s[0], s[1], s[2])
		}
	}
	if index("notification", "webhook", "notification ") < 0 {
		t.Errorf("no notification hop")
	}
	if index("transition", "", "SUBMITTED → FULFILLMENT_REQUESTED") < index("transition", "order-api", "order created") {
		t.Errorf("the order moved before it was created")
	}

	// The journey first: the statuses, the time to the final one, the
	// messages, and that every hop went through, some after a retry.
	if got, want := strings.Join(strings.Fields(text(byID(doc, "journey-path"))), " "), "SUBMITTED → FULFILLMENT_REQUESTED → FULFILLED"; got != want {
		t.Errorf("#journey-path = %q, want %q", got, want)
	}
	facts := strings.Join(strings.Fields(text(byID(doc, "journey-facts"))), " ")
	for _, want := range []string{"Reached FULFILLED ", " after its creation", "4 messages,", "2 notifications", "every hop went through (4 after a retry"} {
		if !strings.Contains(facts, want) {
			t.Errorf("#journey-facts = %q: no %q", facts, want)
		}
	}
	if journey, timeline := byID(doc, "journey"), byID(doc, "timeline"); journey == nil || !before(doc, journey, timeline) {
		t.Errorf("the page does not lead with the journey")
	}
	// The status changes, and only they, are marked, each with its status.
	var changes []string
	for _, h := range hops {
		if h.statusChange != (h.kind == "transition") {
			t.Errorf("hop %q (%s): marked as a status change: %v", h.summary, h.kind, h.statusChange)
		}
		if h.statusChange {
			changes = append(changes, h.status)
		}
	}
	if want := []string{"SUBMITTED", "FULFILLMENT_REQUESTED", "FULFILLED"}; !slices.Equal(changes, want) {
		t.Errorf("the status changes show %v, want %v", changes, want)
	}
	// The webhook refused the first call of each notification: the
	// notifier's deliveries and the notifications say that it was retried
	// and got through, and nothing else says so.
	for _, h := range hops {
		want := ""
		switch {
		case h.kind == "notification":
			want = "failed once, delivered on retry"
		case h.kind == "delivery" && h.actor == "notification":
			want = "failed once, processed on retry"
		}
		if h.retried != want {
			t.Errorf("hop %q (%s by %s): retried note %q, want %q", h.summary, h.kind, h.actor, h.retried, want)
		}
	}

	// The screenshot: a PNG of the window's size, not blank, with the
	// page's dark header band at the top and the timeline's green dots.
	shot := filepath.Join(t.TempDir(), "timeline.png")
	browse(t, browser, url, "--screenshot="+shot, "--window-size=1280,900")
	if keep := os.Getenv("UI_SCREENSHOT"); keep != "" { // to look at it: UI_SCREENSHOT=/tmp/timeline.png
		raw, _ := os.ReadFile(shot)
		_ = os.WriteFile(keep, raw, 0o644)
	}
	checkScreenshot(t, shot)

	// The whole page, in a window taller than it: where its content ends.
	tall := filepath.Join(t.TempDir(), "tall.png")
	browse(t, browser, url, "--screenshot="+tall, fmt.Sprintf("--window-size=%d,%d", windowWidth, tallWindowHeight))
	if height := contentHeight(t, tall); height > maxPageHeight {
		t.Errorf("the page is %d px long, want at most %d (a screen and a half)", height, maxPageHeight)
	} else {
		t.Logf("the page is %d px long", height)
	}
}

// tallWindowHeight is the window that shows the whole page; maxPageHeight
// is how long a plain order's page may be.
const tallWindowHeight, maxPageHeight = 4000, 1350

// contentHeight is the last row of the screenshot at path that is not all
// background (the colour of its bottom left pixel) but one.
func contentHeight(t *testing.T, path string) int {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("chromium wrote no screenshot: %v", err)
	}
	img, err := png.Decode(bytes.NewReader(raw))
	if err != nil {
		t.Fatalf("the screenshot is not a PNG: %v", err)
	}
	b := img.Bounds()
	if b.Dy() != tallWindowHeight {
		t.Fatalf("the screenshot is %d px high, want %d", b.Dy(), tallWindowHeight)
	}
	background := rgba(img, 0, b.Dy()-1)
	for y := b.Dy() - 1; y >= 0; y-- {
		for x := range b.Dx() {
			if rgba(img, x, y) != background {
				if y == b.Dy()-1 {
					t.Fatalf("the page reaches the bottom of a %d px window", b.Dy())
				}
				return y + 1
			}
		}
	}
	t.Fatal("the tall screenshot is blank")
	return 0
}

// before reports whether a comes before b in the document's order.
func before(doc, a, b *html.Node) bool {
	seen := -1
	i := 0
	walk(doc, func(n *html.Node) {
		switch n {
		case a:
			if seen < 0 {
				seen = i
			}
		case b:
			if seen < 0 {
				seen = -2 // b first
			}
		}
		i++
	})
	return seen >= 0
}

func checkScreenshot(t *testing.T, path string) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("chromium wrote no screenshot: %v", err)
	}
	img, err := png.Decode(bytes.NewReader(raw))
	if err != nil {
		t.Fatalf("the screenshot is not a PNG: %v", err)
	}
	if b := img.Bounds(); b.Dx() != windowWidth || b.Dy() != windowHeight {
		t.Fatalf("the screenshot is %dx%d, want %dx%d", b.Dx(), b.Dy(), windowWidth, windowHeight)
	}
	// The background is the most common colour; count the colours and the
	// rows that have something other than background on them.
	counts := map[color.RGBA]int{}
	for y := range windowHeight {
		for x := range windowWidth {
			counts[rgba(img, x, y)]++
		}
	}
	var background color.RGBA
	for c, n := range counts {
		if n > counts[background] {
			background = c
		}
	}
	busy := 0
	for y := range windowHeight {
		for x := range windowWidth {
			if rgba(img, x, y) != background {
				busy++
				break
			}
		}
	}
	if len(counts) < 16 || busy < windowHeight/2 {
		t.Errorf("the screenshot looks blank: %d colours, %d of %d rows not background", len(counts), busy, windowHeight)
	}
	// The header band (#1d3557) across the top, and at least one green dot
	// (#2e9b4f) of a hop that went as it should.
	header, green := color.RGBA{0x1d, 0x35, 0x57, 0xff}, color.RGBA{0x2e, 0x9b, 0x4f, 0xff}
	if rgba(img, 5, 5) != header || rgba(img, windowWidth-5, 5) != header {
		t.Errorf("no header band at the top: %v, %v", rgba(img, 5, 5), rgba(img, windowWidth-5, 5))
	}
	if counts[green] < 20 {
		t.Errorf("no green dot of a hop in the screenshot (%d pixels)", counts[green])
	}
	t.Logf("screenshot: %dx%d, %d colours, %d rows not background (%v)", windowWidth, windowHeight, len(counts), busy, background)
}

func rgba(img image.Image, x, y int) color.RGBA {
	return color.RGBAModel.Convert(img.At(x, y)).(color.RGBA)
}

// The DOM helpers.

func walk(n *html.Node, visit func(*html.Node)) {
	if n == nil {
		return
	}
	if n.Type == html.ElementNode {
		visit(n)
	}
	for c := n.FirstChild; c != nil; c = c.NextSibling {
		walk(c, visit)
	}
}

func find(n *html.Node, match func(*html.Node) bool) *html.Node {
	var found *html.Node
	walk(n, func(m *html.Node) {
		if found == nil && match(m) {
			found = m
		}
	})
	return found
}

func byID(n *html.Node, id string) *html.Node {
	return find(n, func(m *html.Node) bool { return attr(m, "id") == id })
}

func byClass(n *html.Node, class string) *html.Node {
	return find(n, func(m *html.Node) bool { return hasClass(m, class) })
}

func firstElement(n *html.Node, tag string) *html.Node {
	return find(n, func(m *html.Node) bool { return m.Data == tag })
}

func attr(n *html.Node, name string) string {
	if n == nil {
		return ""
	}
	for _, a := range n.Attr {
		if a.Key == name {
			return a.Val
		}
	}
	return ""
}

func hasClass(n *html.Node, class string) bool {
	return slices.Contains(strings.Fields(attr(n, "class")), class)
}

func text(n *html.Node) string {
	if n == nil {
		return ""
	}
	var b strings.Builder
	var collect func(*html.Node)
	collect = func(m *html.Node) {
		if m.Type == html.TextNode {
			b.WriteString(m.Data)
		}
		for c := m.FirstChild; c != nil; c = c.NextSibling {
			collect(c)
		}
	}
	collect(n)
	return strings.TrimSpace(b.String())
}
