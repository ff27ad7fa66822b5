package telemetry

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/yourorg/orders/internal/config"
)

// A duration in a log line reads as a duration, whichever way it reaches
// the record: an attribute of the call, of the logger (With), inside a
// group, or a LogValuer that resolves to one. Other numbers stay numbers.
func TestLoggerWritesDurationsForPeople(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	log := NewLogger("test", config.Log{Level: "info", Format: "json"}, &buf).With(slog.Duration("lease", time.Minute))
	log.Info("broker session ended; reconnecting",
		slog.Duration("retry_in", 4857585135*time.Nanosecond),
		slog.Group("fetch", slog.Duration("took", 1252263260*time.Nanosecond)),
		slog.Any("fast", durationValuer(1500*time.Nanosecond)),
		slog.Duration("negative", -250*time.Millisecond),
		slog.Int("attempts", 3))

	var line struct {
		Lease    any `json:"lease"`
		RetryIn  any `json:"retry_in"`
		Fetch    struct{ Took any }
		Fast     any `json:"fast"`
		Negative any `json:"negative"`
		Attempts any `json:"attempts"`
	}
	if err := json.Unmarshal(buf.Bytes(), &line); err != nil {
		t.Fatalf("%v: %s", err, buf.String())
	}
	for _, c := range []struct {
		key       string
		got, want any
	}{
		{"lease", line.Lease, "1m0s"},
		{"retry_in", line.RetryIn, "4.858s"},
		{"fetch.took", line.Fetch.Took, "1.252s"},
		{"fast", line.Fast, "2µs"},
		{"negative", line.Negative, "-250ms"},
		{"attempts", line.Attempts, 3.0},
	} {
		if c.got != c.want {
			t.Errorf("%s: %#v, want %#v (line: %s)", c.key, c.got, c.want, strings.TrimSpace(buf.String()))
		}
	}

	buf.Reset()
	text := NewLogger("test", config.Log{Level: "info", Format: "text"}, &buf)
	text.Info("claimed", slog.Duration("took", 1252263260*time.Nanosecond))
	if !strings.Contains(buf.String(), "took=1.252s") {
		t.Errorf("text line %q has no took=1.252s", buf.String())
	}
}

type durationValuer time.Duration

func (d durationValuer) LogValue() slog.Value { return slog.DurationValue(time.Duration(d)) }
