package main

import (
	"fmt"
	"html"
	"io"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// point is one finished order on the chart.
type point struct {
	at      time.Duration // when its POST left, from the start of the run
	latency time.Duration // from the POST to the final status
}

// The chart's size and margins, in SVG user units (pixels).
const (
	chartWidth, chartHeight                          = 900, 420
	marginLeft, marginRight, marginTop, marginBottom = 70, 20, 40, 50
)

// writeChart writes an SVG chart of latency over time: a dot per order at
// the time its POST left, and a line through each second's p50 and p99.
// The x axis runs over span (or further, if a point lies beyond it).
func writeChart(w io.Writer, title string, span time.Duration, points []point) error {
	xMax := span.Seconds()
	yTop := 0.0
	for _, p := range points {
		xMax = max(xMax, p.at.Seconds())
		yTop = max(yTop, ms(p.latency))
	}
	if xMax <= 0 {
		xMax = 1
	}
	// Ticks every yStep, up to the first tick at or above the slowest order.
	yStep := niceCeil(yTop / 5)
	yMax := yStep * max(math.Ceil(yTop/yStep*(1-1e-9)), 1)
	plotW := float64(chartWidth - marginLeft - marginRight)
	plotH := float64(chartHeight - marginTop - marginBottom)
	x := func(s float64) float64 { return marginLeft + s/xMax*plotW }
	y := func(v float64) float64 { return marginTop + plotH - v/yMax*plotH }

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n",
		chartWidth, chartHeight, chartWidth, chartHeight)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", chartWidth, chartHeight)
	fmt.Fprintf(&b, `<text x="%d" y="24" font-size="14">%s</text>`+"\n", marginLeft, html.EscapeString(title))

	// Grid and axis labels.
	for v := 0.0; v <= yMax*(1+1e-9); v += yStep {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", x(0), y(v), x(xMax), y(v))
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end" dominant-baseline="middle">%s</text>`+"\n", marginLeft-6, y(v), number(v))
	}
	step := niceCeil(xMax / 10)
	for s := 0.0; s <= xMax*(1+1e-9); s += step {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", x(s), y(0), x(s), y(yMax))
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", x(s), y(0)+16, number(s))
	}
	fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">seconds since the first POST</text>`+"\n", x(xMax/2), chartHeight-8)
	fmt.Fprintf(&b, `<text transform="translate(16 %.1f) rotate(-90)" text-anchor="middle">POST to final status (ms)</text>`+"\n", y(yMax/2))
	fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.0f" height="%.0f" fill="none" stroke="#888"/>`+"\n", marginLeft, marginTop, plotW, plotH)

	// One dot per order.
	b.WriteString(`<g fill="#1f77b4" fill-opacity="0.35">` + "\n")
	for _, p := range points {
		fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="2"/>`+"\n", x(p.at.Seconds()), y(ms(p.latency)))
	}
	b.WriteString("</g>\n")

	// Each second's p50 and p99, at the middle of the second.
	p50, p99 := perSecond(points)
	for _, line := range []struct {
		name, color string
		values      map[int]float64
	}{{"p50", "#2ca02c", p50}, {"p99", "#d62728", p99}} {
		var coords []string
		for _, sec := range slices.Sorted(maps.Keys(line.values)) {
			coords = append(coords, fmt.Sprintf("%.1f,%.1f", x(float64(sec)+0.5), y(line.values[sec])))
		}
		if len(coords) > 0 {
			fmt.Fprintf(&b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="2"/>`+"\n", strings.Join(coords, " "), line.color)
		}
	}
	// The legend, top right.
	lx, ly := float64(chartWidth-marginRight-400), marginTop+14
	fmt.Fprintf(&b, `<rect x="%.1f" y="%d" width="392" height="20" fill="white" fill-opacity="0.85"/>`+"\n", lx-8, ly-10)
	fmt.Fprintf(&b, `<circle cx="%.1f" cy="%d" r="3" fill="#1f77b4"/><text x="%.1f" y="%d" dominant-baseline="middle">an order</text>`+"\n", lx, ly, lx+8, ly)
	for i, line := range []struct{ name, color string }{{"p50", "#2ca02c"}, {"p99", "#d62728"}} {
		x0 := lx + 80 + float64(i)*160
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="%s" stroke-width="2"/><text x="%.1f" y="%d" dominant-baseline="middle">%s of each second</text>`+"\n",
			x0, ly, x0+20, ly, line.color, x0+24, ly, line.name)
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// perSecond returns the p50 and p99 latency (ms) of the orders sent in each
// second of the run, by second.
func perSecond(points []point) (p50, p99 map[int]float64) {
	bySecond := map[int][]time.Duration{}
	for _, p := range points {
		sec := int(p.at / time.Second)
		bySecond[sec] = append(bySecond[sec], p.latency)
	}
	p50, p99 = map[int]float64{}, map[int]float64{}
	for sec, ds := range bySecond {
		slices.Sort(ds)
		p50[sec], p99[sec] = ms(percentile(ds, 50)), ms(percentile(ds, 99))
	}
	return p50, p99
}

// niceCeil returns the smallest 1, 2 or 5 times a power of ten that is at
// least v (1 for v <= 0): the top of an axis, or the step between ticks.
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	base := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5} {
		if m*base >= v*(1-1e-9) {
			return m * base
		}
	}
	return 10 * base
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// number formats an axis label: no trailing zeros, at most 3 decimals.
func number(v float64) string {
	return strconv.FormatFloat(math.Round(v*1000)/1000, 'f', -1, 64)
}
