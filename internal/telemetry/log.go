package telemetry

import (
	"context"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/yourorg/orders/internal/logctx"
)

// contextHandler adds to each record the trace and span ids of the span in
// its context, and the attributes of logctx.With.
type contextHandler struct{ slog.Handler }

func (h contextHandler) Handle(ctx context.Context, r slog.Record) error {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		r.AddAttrs(slog.String("trace_id", sc.TraceID().String()), slog.String("span_id", sc.SpanID().String()))
	}
	r.AddAttrs(logctx.Attrs(ctx)...)
	return h.Handler.Handle(ctx, r)
}

func (h contextHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return contextHandler{h.Handler.WithAttrs(attrs)}
}

func (h contextHandler) WithGroup(name string) slog.Handler {
	return contextHandler{h.Handler.WithGroup(name)}
}

// readableDuration is the handlers' ReplaceAttr: a time.Duration is
// written as a person reads it, "4.858s" or "250ms", where the JSON
// handler would write nanoseconds (4857585135). It is rounded to the
// millisecond, or to the microsecond under a millisecond, so that a
// backoff's jitter does not print nine digits.
func readableDuration(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() != slog.KindDuration {
		return a
	}
	d := a.Value.Duration()
	if d.Abs() >= time.Millisecond {
		d = d.Round(time.Millisecond)
	} else {
		d = d.Round(time.Microsecond)
	}
	return slog.String(a.Key, d.String())
}
