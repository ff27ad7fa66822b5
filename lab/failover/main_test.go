package main

import (
	"errors"
	"flag"
	"io"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/yourorg/orders/internal/testenv/failover"
)

func TestPercentile(t *testing.T) {
	t.Parallel()
	ten := []float64{10, 1, 9, 2, 8, 3, 7, 4, 6, 5}
	for _, tc := range []struct {
		vals []float64
		p    float64
		want float64
	}{
		{ten, 50, 5},
		{ten, 99, 10},
		{ten, 10, 1},
		{ten, 100, 10},
		{[]float64{3}, 50, 3},
		{[]float64{3}, 99, 3},
		{[]float64{1, 2}, 50, 1},
		{[]float64{1, 2}, 51, 2},
	} {
		if got := percentile(tc.vals, tc.p); got != tc.want {
			t.Errorf("percentile(%v, %v) = %v, want %v", tc.vals, tc.p, got, tc.want)
		}
	}
	if got := percentile(nil, 50); !math.IsNaN(got) {
		t.Errorf("percentile of nothing = %v, want NaN", got)
	}
	if !slices.Equal(ten, []float64{10, 1, 9, 2, 8, 3, 7, 4, 6, 5}) {
		t.Errorf("percentile sorted its argument: %v", ten)
	}
}

// The report: a row per failover, "-" for what was not seen, p50 and p99
// by kind and for all, and the accounting.
func TestWriteReport(t *testing.T) {
	t.Parallel()
	s := func(x float64) time.Duration { return time.Duration(x * float64(time.Second)) }
	o := &outcome{mode: failover.WAL, figures: []failover.Figures{
		{Event: failover.Event{Kind: failover.Kill}, WritableIn: s(10.4), Next201: s(10.9), NextPublish: s(11.2), NextApply: s(11.5), Refused: 40, Unanswered: 2, Latest: s(11.8)},
		{Event: failover.Event{Kind: failover.Switchover}, WritableIn: s(2.1), Next201: s(2.6), NextPublish: -1, NextApply: s(3.3), Refused: 12, Latest: s(2.9)},
		{Event: failover.Event{Kind: failover.Kill}, WritableIn: s(11.0), Next201: s(11.6), NextPublish: s(12.0), NextApply: s(12.2), Refused: 44, Unanswered: 1, Latest: s(12.4)},
	}}
	var b strings.Builder
	writeReport(&b, o, 10)
	out := b.String()
	lines := strings.Split(out, "\n")
	row := func(prefix ...string) []string {
		t.Helper()
		for _, l := range lines {
			f := strings.Fields(l)
			if len(f) >= len(prefix) && slices.Equal(f[:len(prefix)], prefix) {
				return f
			}
		}
		t.Fatalf("no row %q in:\n%s", prefix, out)
		return nil
	}
	if !strings.Contains(out, "wal: 3 failovers at 10 orders/s") {
		t.Errorf("no title:\n%s", out)
	}
	for _, tc := range []struct {
		prefix []string
		want   []string
	}{
		{[]string{"#", "kind"}, []string{"#", "kind", "writable", "next", "201", "publish", "apply", "503s", "no", "answer", "latest", "msg"}},
		{[]string{"1", "kill"}, []string{"1", "kill", "10.4", "10.9", "11.2", "11.5", "40", "2", "11.8"}},
		{[]string{"2", "switchover"}, []string{"2", "switchover", "2.1", "2.6", "-", "3.3", "12", "0", "2.9"}},
		{[]string{"p50", "kill"}, []string{"p50", "kill", "10.4", "10.9", "11.2", "11.5", "40", "1", "11.8"}},
		{[]string{"p99", "kill"}, []string{"p99", "kill", "11.0", "11.6", "12.0", "12.2", "44", "2", "12.4"}},
		{[]string{"p50", "switchover"}, []string{"p50", "switchover", "2.1", "2.6", "-", "3.3", "12", "0", "2.9"}},
		{[]string{"p50", "all"}, []string{"p50", "all", "10.4", "10.9", "11.2", "11.5", "40", "1", "11.8"}},
		{[]string{"p99", "all"}, []string{"p99", "all", "11.0", "11.6", "12.0", "12.2", "44", "2", "12.4"}},
	} {
		if got := row(tc.prefix...); !slices.Equal(got, tc.want) {
			t.Errorf("row %v, want %v", got, tc.want)
		}
	}

	o.result = &failover.Result{Orders: 3000, Final: map[string]int{"FULFILLED": 2700, "REJECTED": 300}, Ghosts: 1, Carried: 12010, Rows: 12000,
		Latest: failover.Late{Lateness: s(12.4)}}
	o.errs = []string{"ghost: message m-1 ..."}
	b.Reset()
	writeReport(&b, o, 10)
	for _, want := range []string{
		"orders answered 201: 3000 (FULFILLED 2700, REJECTED 300)",
		"lost 0, ghosts 1, messages without an outbox row 0, never received 0, applied twice 0, unpublished 0",
		"messages carried 12010 for 12000 outbox rows; the latest message 12.4s from its outbox row to its publish",
		"FAILED: 1 failures:\n  ghost: message m-1 ...",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("the report lacks %q:\n%s", want, b.String())
		}
	}
}

func TestParseFlags(t *testing.T) {
	t.Parallel()
	cfg, err := parseFlags(nil, io.Discard)
	if err != nil || cfg.n != 10 || cfg.rate != 10 || !slices.Equal(cfg.modes, []failover.Mode{failover.Poll, failover.WAL}) {
		t.Errorf("defaults: %+v, %v", cfg, err)
	}
	cfg, err = parseFlags([]string{"-n", "4", "-mode", "wal", "-rate", "20"}, io.Discard)
	if err != nil || cfg.n != 4 || cfg.rate != 20 || !slices.Equal(cfg.modes, []failover.Mode{failover.WAL}) {
		t.Errorf("-n 4 -mode wal -rate 20: %+v, %v", cfg, err)
	}
	for _, args := range [][]string{{"-mode", "logical"}, {"-n", "0"}, {"-rate", "0"}, {"extra"}} {
		if _, err := parseFlags(args, io.Discard); err == nil {
			t.Errorf("%q: no error", args)
		}
	}
	if _, err := parseFlags([]string{"-h"}, io.Discard); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: %v, want flag.ErrHelp", err)
	}
}
