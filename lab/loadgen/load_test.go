package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeAPI answers POST and GET /v1/orders as order-api does, with orders
// that become FULFILLED a fixed time after their creation. The real flow
// is tested in test/e2e (TestLoadgenAgainstTheProcesses); this one pins
// loadgen's own bookkeeping: paging, errors, orders that never finish.
type fakeAPI struct {
	failEvery  int           // every failEvery-th POST answers 503 (0: none)
	stuckEvery int           // every stuckEvery-th order never finishes (0: none)
	settle     time.Duration // from creation to FULFILLED
	token      string        // every request must carry it as a bearer token ("": none)

	mu     sync.Mutex
	posts  int
	orders []fakeOrder // oldest first
	lists  int
}

type fakeOrder struct {
	id      string
	created time.Time
	stuck   bool
}

func (f *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := time.Now()
	if f.token != "" && r.Header.Get("Authorization") != "Bearer "+f.token {
		w.Header().Set("WWW-Authenticate", "Bearer")
		http.Error(w, "no token", http.StatusUnauthorized)
		return
	}
	view := func(o fakeOrder) apiOrder {
		if !o.stuck && now.Sub(o.created) >= f.settle {
			return apiOrder{ID: o.id, Status: "FULFILLED", CreatedAt: o.created, UpdatedAt: o.created.Add(f.settle)}
		}
		return apiOrder{ID: o.id, Status: "SUBMITTED", CreatedAt: o.created, UpdatedAt: o.created}
	}
	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/v1/orders":
		f.posts++
		if f.failEvery > 0 && f.posts%f.failEvery == 0 {
			http.Error(w, "unavailable", http.StatusServiceUnavailable)
			return
		}
		o := fakeOrder{id: fmt.Sprintf("00000000-0000-0000-0000-%012d", len(f.orders)), created: now}
		o.stuck = f.stuckEvery > 0 && len(f.orders)%f.stuckEvery == 0
		f.orders = append(f.orders, o)
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(view(o))
	case r.Method == http.MethodGet && r.URL.Path == "/v1/orders":
		f.lists++
		limit, _ := strconv.Atoi(r.URL.Query().Get("limit"))
		if limit < 1 || limit > 200 {
			http.Error(w, "bad limit", http.StatusBadRequest)
			return
		}
		// The cursor is the index of the last order of the previous page.
		end := len(f.orders)
		if after := r.URL.Query().Get("after"); after != "" {
			end, _ = strconv.Atoi(after)
		}
		page := struct {
			Orders     []apiOrder `json:"orders"`
			NextCursor *string    `json:"next_cursor"`
		}{Orders: []apiOrder{}}
		i := end - 1
		for ; i >= 0 && len(page.Orders) < limit; i-- {
			page.Orders = append(page.Orders, view(f.orders[i]))
		}
		if i >= 0 {
			next := strconv.Itoa(i + 1)
			page.NextCursor = &next
		}
		_ = json.NewEncoder(w).Encode(page)
	default:
		http.NotFound(w, r)
	}
}

func runAgainst(t *testing.T, api *fakeAPI, args ...string) (s summary, progress string, err error) {
	t.Helper()
	api.token = "loadgen-token"
	srv := httptest.NewServer(api)
	t.Cleanup(srv.Close)
	var stdout, stderr bytes.Buffer
	err = run(t.Context(), append([]string{"-api", srv.URL, "-json", "-token", api.token}, args...), &stdout, &stderr)
	if jerr := json.Unmarshal(stdout.Bytes(), &s); jerr != nil {
		t.Fatalf("the summary is not JSON: %v\n%s\nstderr:\n%s", jerr, stdout.String(), stderr.String())
	}
	return s, stderr.String(), err
}

// More orders than one page of the list, and some POSTs refused: every
// created order is found final, the refused ones are counted by status,
// and the run fails because not every order due was created.
func TestLoadgenCountsEveryOrder(t *testing.T) {
	t.Parallel()
	api := &fakeAPI{failEvery: 50, settle: 20 * time.Millisecond}
	chart := filepath.Join(t.TempDir(), "latency.svg")
	s, progress, err := runAgainst(t, api, "-rate", "500", "-duration", "1s", "-concurrency", "500", "-wait", "10s", "-chart", chart)

	if err == nil || !strings.Contains(err.Error(), "10 of 500 orders were not created") {
		t.Errorf("run: %v, want 10 of 500 orders not created", err)
	}
	if s.Expected != 500 || s.Sent != 500 || s.Dropped != 0 || s.Created != 490 {
		t.Errorf("expected %d, sent %d, dropped %d, created %d; want 500, 500, 0, 490", s.Expected, s.Sent, s.Dropped, s.Created)
	}
	if len(s.Errors) != 1 || s.Errors["503"] != 10 {
		t.Errorf("errors %v, want 503: 10", s.Errors)
	}
	if len(s.Final) != 1 || s.Final["FULFILLED"] != 490 || s.Unfinished != 0 {
		t.Errorf("final %v, unfinished %d; want FULFILLED 490, 0", s.Final, s.Unfinished)
	}
	// Each latency is the POST's round trip plus the 20 ms the fake takes.
	if l := s.Latency; l.P50 < 20 || l.P90 < l.P50 || l.P99 < l.P90 || l.Max < l.P99 {
		t.Errorf("latency %+v: want 20 ms or more, in order", l)
	}
	if s.PostLatency.Max <= 0 || s.PostRate <= 0 || s.Throughput <= 0 {
		t.Errorf("post latency %+v, post rate %v, throughput %v: want them measured", s.PostLatency, s.PostRate, s.Throughput)
	}
	if !strings.Contains(progress, "final status 490/490") {
		t.Errorf("progress (on stderr with -json) does not end with every order final:\n%s", progress)
	}
	doc, rerr := os.ReadFile(chart)
	if rerr != nil {
		t.Fatal(rerr)
	}
	dots := 0
	for _, e := range parseSVG(t, doc) {
		if e.name == "circle" && e.attrs["r"] == "2" {
			dots++
		}
	}
	if dots != 490 {
		t.Errorf("the chart has %d dots, want 490", dots)
	}
}

// Orders that never reach a final status: the run waits -wait, counts
// them, and fails.
func TestLoadgenReportsUnfinishedOrders(t *testing.T) {
	t.Parallel()
	api := &fakeAPI{stuckEvery: 10, settle: 5 * time.Millisecond}
	s, _, err := runAgainst(t, api, "-rate", "100", "-duration", "500ms", "-wait", "500ms")
	if err == nil || !strings.Contains(err.Error(), "5 orders did not reach a final status") {
		t.Errorf("run: %v, want 5 orders not final", err)
	}
	if s.Created != 50 || s.Unfinished != 5 || s.Final["FULFILLED"] != 45 {
		t.Errorf("created %d, unfinished %d, final %v; want 50, 5, FULFILLED 45", s.Created, s.Unfinished, s.Final)
	}
	api.mu.Lock()
	defer api.mu.Unlock()
	if api.lists < 2 {
		t.Errorf("the list was read %d times: loadgen did not keep waiting", api.lists)
	}
}

func TestLoadgenText(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(&fakeAPI{settle: time.Millisecond})
	t.Cleanup(srv.Close)
	var stdout, stderr bytes.Buffer
	if err := run(t.Context(), []string{"-api", srv.URL, "-rate", "50", "-duration", "200ms"}, &stdout, &stderr); err != nil {
		t.Fatalf("run: %v\n%s", err, stdout.String())
	}
	out := stdout.String()
	for _, want := range []string{"10 orders at 50/s", "created     10; errors: none", "finished    10: FULFILLED 10", "POST to final status: p50 "} {
		if !strings.Contains(out, want) {
			t.Errorf("the summary has no %q:\n%s", want, out)
		}
	}
}

func TestLoadgenRejectsBadFlags(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"-rate", "0"}, {"-duration", "-1s"}, {"-rate", "1", "-duration", "100ms"}, {"-api", "127.0.0.1:8080"}, {"-concurrency", "0"}, {"-nonsense"}, {"extra"},
	} {
		var stderr bytes.Buffer
		if err := run(t.Context(), args, &bytes.Buffer{}, &stderr); !errors.Is(err, errUsage) {
			t.Errorf("%v: %v, want errUsage", args, err)
		}
	}
}
