package main

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strings"
	"time"
)

// summary is what a run reports; -json prints it as it is.
type summary struct {
	API       string  `json:"api"`
	Rate      float64 `json:"rate"`       // orders per second asked for
	DurationS float64 `json:"duration_s"` // how long sending was asked to last
	Expected  int     `json:"expected"`   // orders due: rate × duration
	Sent      int     `json:"sent"`       // POSTs sent
	Dropped   int     `json:"dropped"`    // orders not sent: -concurrency POSTs were in flight
	Created   int     `json:"created"`    // POSTs answered 201
	// Errors counts the POSTs not answered 201, by status code, or
	// "no response".
	Errors map[string]int `json:"errors"`
	// Final counts the created orders by final status.
	Final      map[string]int `json:"final"`
	Unfinished int            `json:"unfinished"` // created, and not final within -wait
	// SendingS is how long sending took, to the last POST's answer.
	SendingS float64 `json:"sending_s"`
	// PostRate is the orders created per second of sending.
	PostRate float64 `json:"post_rate"`
	// Throughput is the orders finished per second, from the first order's
	// creation to the last final status (the database's clock).
	Throughput float64 `json:"throughput"`
	// Latency is from each POST to its order's final status, in
	// milliseconds, over the finished orders.
	Latency percentiles `json:"latency_ms"`
	// PostLatency is the POSTs' round trips alone, in milliseconds, over
	// the created orders.
	PostLatency percentiles `json:"post_latency_ms"`
}

// percentiles of a set of durations, in milliseconds.
type percentiles struct {
	P50 float64 `json:"p50"`
	P90 float64 `json:"p90"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
}

// percentile returns the p-th percentile (0 < p <= 100) of sorted by the
// nearest-rank method: the smallest value with at least p% of the values at
// or below it. It is 0 for no values.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	return sorted[max(rank, 1)-1]
}

// percentilesOf returns the percentiles of ds (in any order; ds is not
// changed).
func percentilesOf(ds []time.Duration) percentiles {
	sorted := slices.Sorted(slices.Values(ds))
	ms := func(d time.Duration) float64 { return math.Round(float64(d)/1e3) / 1e3 }
	var out percentiles
	if len(sorted) > 0 {
		out = percentiles{
			P50: ms(percentile(sorted, 50)),
			P90: ms(percentile(sorted, 90)),
			P99: ms(percentile(sorted, 99)),
			Max: ms(sorted[len(sorted)-1]),
		}
	}
	return out
}

func (g *generator) summary(cfg config, expected int, start time.Time, sending time.Duration) summary {
	s := summary{
		API:       cfg.api,
		Rate:      cfg.rate,
		DurationS: cfg.duration.Seconds(),
		Expected:  expected,
		Sent:      int(g.sent.Load()),
		Dropped:   int(g.dropped.Load()),
		Created:   len(g.orders),
		Errors:    maps.Clone(g.errors),
		Final:     map[string]int{},
		SendingS:  sending.Seconds(),
	}
	var latencies, posts []time.Duration
	var first, last time.Time
	for _, p := range g.orders {
		posts = append(posts, p.post)
		if p.status == "" {
			s.Unfinished++
			continue
		}
		s.Final[p.status]++
		latencies = append(latencies, p.latency())
		if first.IsZero() || p.createdAt.Before(first) {
			first = p.createdAt
		}
		if p.finalAt.After(last) {
			last = p.finalAt
		}
	}
	if sending > 0 {
		s.PostRate = float64(s.Created) / sending.Seconds()
	}
	if span := last.Sub(first); span > 0 {
		s.Throughput = float64(len(latencies)) / span.Seconds()
	}
	s.Latency = percentilesOf(latencies)
	s.PostLatency = percentilesOf(posts)
	return s
}

// failed is the number of POSTs not answered 201.
func (s summary) failed() int {
	n := 0
	for _, c := range s.Errors {
		n += c
	}
	return n
}

func (s summary) writeJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(s)
}

func (s summary) writeText(w io.Writer, cfg config) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%d orders at %g/s for %s against %s\n", s.Expected, s.Rate, cfg.duration, s.API)
	fmt.Fprintf(&b, "sent        %d; dropped %d (due while all -concurrency %d POSTs were in flight)\n", s.Sent, s.Dropped, cfg.concurrency)
	fmt.Fprintf(&b, "created     %d; errors: %s\n", s.Created, counts(s.Errors, "none"))
	fmt.Fprintf(&b, "finished    %d: %s; not final within -wait %s: %d\n", s.Created-s.Unfinished, counts(s.Final, "none"), cfg.wait, s.Unfinished)
	fmt.Fprintf(&b, "throughput  POST %.1f orders/s; end to end %.1f orders/s (first creation to last final status)\n", s.PostRate, s.Throughput)
	fmt.Fprintf(&b, "latency     POST to final status: %s\n", s.Latency)
	fmt.Fprintf(&b, "            POST alone:           %s\n", s.PostLatency)
	if cfg.chart != "" {
		fmt.Fprintf(&b, "chart       %s\n", cfg.chart)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func (p percentiles) String() string {
	return fmt.Sprintf("p50 %.1f ms  p90 %.1f ms  p99 %.1f ms  max %.1f ms", p.P50, p.P90, p.P99, p.Max)
}

// counts formats a tally as "A 3, B 1", sorted by key; empty when there is
// nothing.
func counts(m map[string]int, empty string) string {
	if len(m) == 0 {
		return empty
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}
