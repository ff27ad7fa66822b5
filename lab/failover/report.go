package main

import (
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/yourorg/orders/internal/testenv/failover"
)

// percentile is the p-th percentile (0 < p <= 100) of vals by the nearest
// rank: the smallest value at or above p percent of them. NaN when vals
// is empty.
func percentile(vals []float64, p float64) float64 {
	if len(vals) == 0 {
		return math.NaN()
	}
	s := slices.Sorted(slices.Values(vals))
	rank := int(math.Ceil(p / 100 * float64(len(s))))
	return s[min(max(rank, 1), len(s))-1]
}

// columns are the figures of a failover the report prints, in order.
var columns = []struct {
	name    string
	seconds bool // a duration, in seconds; else a count
	value   func(failover.Figures) float64
}{
	{"writable", true, func(f failover.Figures) float64 { return seconds(f.WritableIn) }},
	{"next 201", true, func(f failover.Figures) float64 { return seconds(f.Next201) }},
	{"publish", true, func(f failover.Figures) float64 { return seconds(f.NextPublish) }},
	{"apply", true, func(f failover.Figures) float64 { return seconds(f.NextApply) }},
	{"503s", false, func(f failover.Figures) float64 { return float64(f.Refused) }},
	{"no answer", false, func(f failover.Figures) float64 { return float64(f.Unanswered) }},
	{"latest msg", true, func(f failover.Figures) float64 { return seconds(f.Latest) }},
}

// seconds is d in seconds; NaN for a negative d (not seen).
func seconds(d time.Duration) float64 {
	if d < 0 {
		return math.NaN()
	}
	return d.Seconds()
}

// cell formats v: one decimal for seconds, none for a count, "-" for NaN.
func cell(v float64, secs bool) string {
	switch {
	case math.IsNaN(v):
		return "-"
	case secs:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.0f", v)
}

// writeReport prints, for a campaign in one relay mode: a row per
// failover (its kind, and seconds from the event to the new leader taking
// writes, to the next 201, to the relay publishing again, to the consumer
// applying again, the creates answered 503 and unanswered until the next
// failover, the latest message), then p50 and p99 of each column for
// each kind and for all, then the accounting.
func writeReport(w io.Writer, o *outcome, rate int) {
	_, _ = fmt.Fprintf(w, "\n%s: %d failovers at %d orders/s (seconds from the kill or the switchover's request)\n", o.mode, len(o.figures), rate)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	header := []string{"#", "kind"}
	for _, c := range columns {
		header = append(header, c.name)
	}
	_, _ = fmt.Fprintln(tw, strings.Join(header, "\t")+"\t")
	for i, f := range o.figures {
		row := []string{fmt.Sprint(i + 1), string(f.Kind)}
		for _, c := range columns {
			row = append(row, cell(c.value(f), c.seconds))
		}
		_, _ = fmt.Fprintln(tw, strings.Join(row, "\t")+"\t")
	}
	for _, kind := range []failover.Kind{failover.Kill, failover.Switchover, ""} {
		var figs []failover.Figures
		for _, f := range o.figures {
			if kind == "" || f.Kind == kind {
				figs = append(figs, f)
			}
		}
		if len(figs) == 0 {
			continue
		}
		label := string(kind)
		if kind == "" {
			label = "all"
		}
		for _, p := range []float64{50, 99} {
			row := []string{fmt.Sprintf("p%.0f", p), label}
			for _, c := range columns {
				var vals []float64
				for _, f := range figs {
					if v := c.value(f); !math.IsNaN(v) {
						vals = append(vals, v)
					}
				}
				row = append(row, cell(percentile(vals, p), c.seconds))
			}
			_, _ = fmt.Fprintln(tw, strings.Join(row, "\t")+"\t")
		}
	}
	_ = tw.Flush()
	if r := o.result; r != nil {
		var final []string
		for _, s := range slices.Sorted(maps.Keys(r.Final)) {
			final = append(final, fmt.Sprintf("%s %d", s, r.Final[s]))
		}
		_, _ = fmt.Fprintf(w, "orders answered 201: %d (%s)\n", r.Orders, strings.Join(final, ", "))
		_, _ = fmt.Fprintf(w, "lost %d, ghosts %d, messages without an outbox row %d, never received %d, applied twice %d, unpublished %d\n",
			r.Lost, r.Ghosts, r.Rowless, r.NeverReceived, r.AppliedTwice, r.Unpublished)
		_, _ = fmt.Fprintf(w, "messages carried %d for %d outbox rows; the latest message %.1fs from its outbox row to its publish\n",
			r.Carried, r.Rows, r.Latest.Lateness.Seconds())
	}
	if len(o.errs) > 0 {
		_, _ = fmt.Fprintf(w, "FAILED: %d failures:\n", len(o.errs))
		for _, e := range o.errs {
			_, _ = fmt.Fprintf(w, "  %s\n", strings.TrimSpace(e))
		}
	}
}
