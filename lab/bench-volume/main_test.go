package main

import (
	"io"
	"testing"
	"time"
)

func TestMedian(t *testing.T) {
	ms := func(n ...int) []time.Duration {
		out := make([]time.Duration, len(n))
		for i, v := range n {
			out[i] = time.Duration(v) * time.Millisecond
		}
		return out
	}
	for _, c := range []struct {
		in   []time.Duration
		want time.Duration
	}{
		{nil, 0},
		{ms(5), 5 * time.Millisecond},
		{ms(9, 1, 5), 5 * time.Millisecond},
		{ms(4, 1, 3, 2), 2500 * time.Microsecond},
	} {
		if got := median(c.in); got != c.want {
			t.Errorf("median(%v) = %v, want %v", c.in, got, c.want)
		}
	}
}

func TestRatio(t *testing.T) {
	if got := ratio(3*time.Millisecond, 2*time.Millisecond); got != 1.5 {
		t.Errorf("ratio(3ms, 2ms) = %v, want 1.5", got)
	}
	if got := ratio(time.Millisecond, 0); got != 0 {
		t.Errorf("ratio over an empty figure of 0 = %v, want 0", got)
	}
}

func TestParseFlags(t *testing.T) {
	env := func(k string) string {
		if k == "DATABASE_URL" {
			return "postgres://db/x"
		}
		return ""
	}
	cfg, err := parseFlags([]string{"-orders", "10", "-weeks", "3"}, env, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.databaseURL != "postgres://db/x" || cfg.orders != 10 || cfg.weeks != 3 || cfg.samples != 40 {
		t.Errorf("parseFlags = %+v", cfg)
	}
	if _, err := parseFlags([]string{"-samples", "0"}, env, io.Discard); err == nil {
		t.Error("-samples 0 accepted")
	}
}
