package main

import (
	"bytes"
	"encoding/xml"
	"errors"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"
)

// svgElement is what the tests read of the chart's elements.
type svgElement struct {
	name  string
	attrs map[string]string
	text  string
}

// parseSVG checks that doc is well-formed XML with an <svg> root, and
// returns its elements in document order.
func parseSVG(t *testing.T, doc []byte) []svgElement {
	t.Helper()
	dec := xml.NewDecoder(bytes.NewReader(doc))
	var out []svgElement
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("the chart is not well-formed XML: %v\n%s", err, doc)
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			e := svgElement{name: tok.Name.Local, attrs: map[string]string{}}
			for _, a := range tok.Attr {
				e.attrs[a.Name.Local] = a.Value
			}
			out = append(out, e)
		case xml.CharData:
			if len(out) > 0 {
				out[len(out)-1].text += string(tok)
			}
		}
	}
	if len(out) == 0 || out[0].name != "svg" || out[0].attrs["viewBox"] == "" {
		t.Fatalf("the chart's root is not an <svg> with a viewBox:\n%s", doc)
	}
	return out
}

func TestChartDrawsEveryOrder(t *testing.T) {
	t.Parallel()
	points := []point{
		{at: 100 * time.Millisecond, latency: 20 * time.Millisecond},
		{at: 1200 * time.Millisecond, latency: 180 * time.Millisecond},
		{at: 1300 * time.Millisecond, latency: 25 * time.Millisecond},
		{at: 2900 * time.Millisecond, latency: 30 * time.Millisecond},
	}
	var buf bytes.Buffer
	if err := writeChart(&buf, `50 orders at 25/s <"test"> & more`, 3*time.Second, points); err != nil {
		t.Fatal(err)
	}
	elems := parseSVG(t, buf.Bytes())

	var dots []svgElement
	var polylines, texts []string
	for _, e := range elems {
		switch {
		case e.name == "circle" && e.attrs["r"] == "2":
			dots = append(dots, e)
		case e.name == "polyline":
			polylines = append(polylines, e.attrs["points"])
		case e.name == "text":
			texts = append(texts, strings.TrimSpace(e.text))
		}
	}
	if len(dots) != len(points) {
		t.Fatalf("%d dots, want one per order (%d)", len(dots), len(points))
	}
	coord := func(e svgElement, attr string) float64 {
		v, err := strconv.ParseFloat(e.attrs[attr], 64)
		if err != nil {
			t.Fatalf("%s=%q: %v", attr, e.attrs[attr], err)
		}
		return v
	}
	// Later orders are further right; slower ones higher up (smaller y).
	for i := 1; i < len(dots); i++ {
		if coord(dots[i], "cx") <= coord(dots[i-1], "cx") {
			t.Errorf("dot %d is not right of dot %d", i, i-1)
		}
	}
	if coord(dots[1], "cy") >= coord(dots[0], "cy") {
		t.Errorf("the 180 ms order is not above the 20 ms one")
	}
	for _, d := range dots {
		if x, y := coord(d, "cx"), coord(d, "cy"); x < marginLeft || x > chartWidth-marginRight || y < marginTop || y > chartHeight-marginBottom {
			t.Errorf("dot at (%v, %v) lies outside the plot", x, y)
		}
	}
	// Seconds 0, 1 and 2 have orders: the p50 and p99 lines have a vertex each.
	if len(polylines) != 2 {
		t.Fatalf("%d lines, want p50 and p99", len(polylines))
	}
	for _, pl := range polylines {
		if n := len(strings.Fields(pl)); n != 3 {
			t.Errorf("line %q has %d vertices, want 3 (one per second with orders)", pl, n)
		}
	}
	joined := strings.Join(texts, "|")
	for _, want := range []string{`50 orders at 25/s <"test"> & more`, "seconds since the first POST", "POST to final status (ms)", "|200|", "|0|"} {
		if !strings.Contains("|"+joined+"|", want) {
			t.Errorf("no text %q in the chart: %s", want, joined)
		}
	}
}

func TestChartWithoutOrders(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	if err := writeChart(&buf, "nothing finished", 0, nil); err != nil {
		t.Fatal(err)
	}
	for _, e := range parseSVG(t, buf.Bytes()) {
		if e.name == "polyline" || (e.name == "circle" && e.attrs["r"] == "2") {
			t.Errorf("an empty chart has a %s", e.name)
		}
		for k, v := range e.attrs {
			if strings.Contains(v, "NaN") || strings.Contains(v, "Inf") {
				t.Errorf("<%s %s=%q>", e.name, k, v)
			}
		}
	}
}

func TestNiceCeil(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want float64 }{
		{0, 1}, {-3, 1}, {0.3, 0.5}, {1, 1}, {1.01, 2}, {2, 2}, {3, 5}, {5, 5}, {7, 10}, {10, 10}, {180, 200}, {201, 500}, {999, 1000}, {4200, 5000},
	} {
		if got := niceCeil(tc.in); got != tc.want {
			t.Errorf("niceCeil(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
}
