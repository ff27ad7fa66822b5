package main

import (
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	t.Parallel()
	hundred := make([]time.Duration, 100)
	for i := range hundred {
		hundred[i] = time.Duration(i+1) * time.Millisecond
	}
	for _, tc := range []struct {
		name   string
		sorted []time.Duration
		p      float64
		want   time.Duration
	}{
		{"none", nil, 50, 0},
		{"one value is every percentile", []time.Duration{7}, 1, 7},
		{"one value, p100", []time.Duration{7}, 100, 7},
		{"p50 of 1..100", hundred, 50, 50 * time.Millisecond},
		{"p90 of 1..100", hundred, 90, 90 * time.Millisecond},
		{"p99 of 1..100", hundred, 99, 99 * time.Millisecond},
		{"p100 is the largest", hundred, 100, 100 * time.Millisecond},
		// Nearest rank: the smallest value with at least p% at or below it.
		{"p50 of four is the second", []time.Duration{1, 2, 3, 4}, 50, 2},
		{"p51 of four is the third", []time.Duration{1, 2, 3, 4}, 51, 3},
		{"p99 of ten is the largest", []time.Duration{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 99, 10},
	} {
		if got := percentile(tc.sorted, tc.p); got != tc.want {
			t.Errorf("%s: percentile(p%g) = %v, want %v", tc.name, tc.p, got, tc.want)
		}
	}
}

func TestPercentilesOfSortsACopy(t *testing.T) {
	t.Parallel()
	ds := []time.Duration{40 * time.Millisecond, 10 * time.Millisecond, 30 * time.Millisecond, 20 * time.Millisecond, 1500 * time.Microsecond}
	got := percentilesOf(ds)
	want := percentiles{P50: 20, P90: 40, P99: 40, Max: 40}
	if got != want {
		t.Errorf("percentilesOf = %+v, want %+v", got, want)
	}
	if ds[0] != 40*time.Millisecond || ds[4] != 1500*time.Microsecond {
		t.Errorf("percentilesOf reordered its argument: %v", ds)
	}
	if got := percentilesOf([]time.Duration{1500 * time.Microsecond}); got.P50 != 1.5 {
		t.Errorf("1.5 ms reported as %v ms", got.P50)
	}
	if got := percentilesOf(nil); got != (percentiles{}) {
		t.Errorf("no values: %+v, want zeros", got)
	}
}
