package e2e

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/yourorg/orders/api/apicheck"
)

// loadgenSummary is the part of loadgen's -json summary this test reads.
type loadgenSummary struct {
	Expected   int            `json:"expected"`
	Sent       int            `json:"sent"`
	Dropped    int            `json:"dropped"`
	Created    int            `json:"created"`
	Errors     map[string]int `json:"errors"`
	Final      map[string]int `json:"final"`
	Unfinished int            `json:"unfinished"`
	Latency    struct {
		P50 float64 `json:"p50"`
		P90 float64 `json:"p90"`
		P99 float64 `json:"p99"`
		Max float64 `json:"max"`
	} `json:"latency_ms"`
}

// The load generator against order-api, a relay and a consumer as
// processes: a short run at a low rate exits 0, every order it created
// reached its final status, and its summary counts what the database holds.
// (Speed is the bench's to report, not this test's to assert.)
func TestLoadgenAgainstTheProcesses(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	// This test checks loadgen's accounting, not how much load the API
	// sheds: a request waits as long as it needs for a connection, where
	// the default second made a busy machine answer 503 to a third of the
	// POSTs.
	s.startAPI("DB_ACQUIRE_TIMEOUT=30s")
	s.startConsumer("consumer-1")
	s.startRelay("relay-1")

	dir := t.TempDir()
	build := exec.Command("go", "build", "-o", dir+"/", "../../lab/loadgen")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	chart := filepath.Join(dir, "latency.svg")
	// Its traffic goes through a proxy that checks it against api/openapi.yaml.
	run := exec.Command(filepath.Join(dir, "loadgen"), "-api", apicheck.Proxy(t, s.apiURL), "-token", s.token, "-rate", "20", "-duration", "2s", "-wait", "60s", "-json", "-chart", chart)
	var stderr strings.Builder
	run.Stderr = &stderr
	out, err := run.Output()
	if err != nil {
		t.Fatalf("loadgen: %v\nstdout:\n%s\nstderr:\n%s", err, out, stderr.String())
	}
	var sum loadgenSummary
	if err := json.Unmarshal(out, &sum); err != nil {
		t.Fatalf("loadgen -json: %v\n%s", err, out)
	}
	if sum.Expected != 40 || sum.Sent != 40 || sum.Dropped != 0 || sum.Created != 40 || len(sum.Errors) != 0 {
		t.Errorf("expected %d, sent %d, dropped %d, created %d, errors %v; want 40, 40, 0, 40, none",
			sum.Expected, sum.Sent, sum.Dropped, sum.Created, sum.Errors)
	}
	if sum.Unfinished != 0 || len(sum.Final) != 1 || sum.Final["FULFILLED"] != 40 {
		t.Errorf("final %v, unfinished %d; want FULFILLED 40, 0", sum.Final, sum.Unfinished)
	}
	if l := sum.Latency; l.P50 <= 0 || l.P90 < l.P50 || l.P99 < l.P90 || l.Max < l.P99 {
		t.Errorf("latency percentiles %+v: want positive and in order", l)
	}

	// The database agrees: 40 orders, all FULFILLED.
	conn, err := pgx.Connect(context.Background(), s.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var total, fulfilled int
	if err := conn.QueryRow(context.Background(),
		"SELECT count(*), count(*) FILTER (WHERE status = 'FULFILLED') FROM orders").Scan(&total, &fulfilled); err != nil {
		t.Fatal(err)
	}
	if total != 40 || fulfilled != 40 {
		t.Errorf("the database has %d orders, %d FULFILLED; want 40, 40", total, fulfilled)
	}

	svg, err := os.ReadFile(chart)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(svg), "<svg ") || strings.Count(string(svg), `r="2"/>`) != 40 {
		t.Errorf("the chart is not an SVG with a dot per order:\n%.300s", svg)
	}

	for _, name := range []string{"relay-1", "consumer-1", "order-api"} {
		s.stop(name)
	}
}
