package main

import (
	"strings"
	"testing"
)

func TestStatementKind(t *testing.T) {
	for query, want := range map[string]string{
		"begin":   "BEGIN",
		"COMMIT;": "COMMIT",
		"-- name: ClaimOutbox :many\nUPDATE message_outbox SET status = $1":                                             "UPDATE",
		"-- name: MarkOutbox :one\nWITH published AS (UPDATE m SET a = $1 RETURNING id) SELECT count(*) FROM published": "SELECT (WITH)",
		"  select pg_notify($1, $2)": "SELECT",
	} {
		if got := statementKind(query); got != want {
			t.Errorf("statementKind(%q) = %q, want %q", query, got, want)
		}
	}
}

// The comparison averages each version's runs at a rate, line by line,
// and prints new/old.
func TestPrintComparison(t *testing.T) {
	run := func(version string, orders int, commits int64, apiSeconds float64) result {
		return result{version: version, rate: 50, finished: orders,
			cpu: []cpuUse{{name: "order-api", seconds: apiSeconds}, {name: "outbox-relay-1", seconds: 1}},
			db:  dbCost{commits: commits, writes: map[string]rowWrites{"orders": {inserted: int64(orders)}}}}
	}
	results := []result{
		run("new", 1000, 3000, 1), run("old", 1000, 6000, 2),
		run("old", 1000, 6000, 4), run("new", 1000, 3000, 1),
	}
	var out strings.Builder
	if err := printComparison(&out, "abc123", results); err != nil {
		t.Fatal(err)
	}
	for _, row := range []string{
		"| CPU ms: order-api | 3.000 | 1.000 | 0.33 |",
		"| CPU ms: outbox-relays | 1.000 | 1.000 | 1.00 |",
		"| transactions committed | 6.000 | 3.000 | 0.50 |",
		"| rows inserted: orders | 1.000 | 1.000 | 1.00 |",
		"50 orders/s (2 runs of each)",
	} {
		if !strings.Contains(out.String(), row) {
			t.Errorf("no %q in:\n%s", row, out.String())
		}
	}
	if err := printComparison(&out, "abc123", results[:1]); err == nil {
		t.Error("a rate with runs of one version only: want an error")
	}
}
