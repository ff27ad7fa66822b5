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
	if cfg, err := parseFlags([]string{"-reuse", "volume_full1_x"}, env, io.Discard); err != nil || cfg.reuse != "volume_full1_x" || cfg.keep {
		t.Errorf("parseFlags -reuse = %+v, %v", cfg, err)
	}
}

func TestParseHorizonFlags(t *testing.T) {
	env := func(string) string { return "" }
	cfg, err := parseFlags([]string{"-horizon", "10m", "-horizon-modes", "wal, poll,wal"}, env, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.horizon != 10*time.Minute || len(cfg.modes) != 2 || cfg.modes[0] != "wal" || cfg.modes[1] != "poll" ||
		cfg.amqpURL != "amqp://guest:guest@127.0.0.1:5672/" {
		t.Errorf("parseFlags = %+v", cfg)
	}
	if cfg, _ := parseFlags(nil, env, io.Discard); cfg.horizon != 0 || len(cfg.modes) != 2 {
		t.Errorf("by default the history run, with both modes named: %+v", cfg)
	}
	for _, args := range [][]string{{"-horizon-modes", "poll,kafka"}, {"-horizon", "-1s"}, {"-horizon-drains", "0"}} {
		if _, err := parseFlags(args, env, io.Discard); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
}

func TestDueRows(t *testing.T) {
	for _, c := range []struct {
		rate             int
		elapsed          time.Duration
		written, wantDue int
	}{
		{100, 0, 0, 0},
		{100, 1500 * time.Millisecond, 0, 150},
		{100, 1500 * time.Millisecond, 149, 1},
		{100, time.Second, 120, 0}, // ahead: nothing owed, nothing taken back
	} {
		if got := dueRows(c.rate, c.elapsed, c.written); got != c.wantDue {
			t.Errorf("dueRows(%d, %v, %d) = %d, want %d", c.rate, c.elapsed, c.written, got, c.wantDue)
		}
	}
}

func TestRates(t *testing.T) {
	if got := rowsPerSecond(3000, 1500*time.Millisecond); got != 2000 {
		t.Errorf("rowsPerSecond(3000, 1.5s) = %v, want 2000", got)
	}
	if got := rowsPerSecond(10, 0); got != 0 {
		t.Errorf("rowsPerSecond over no time = %v, want 0", got)
	}
	if got := medianRate([]float64{300, 100, 200, 400}); got != 250 {
		t.Errorf("medianRate = %v, want 250", got)
	}
	if got := medianRate(nil); got != 0 {
		t.Errorf("medianRate of none = %v, want 0", got)
	}
}
