// Package logctx carries log attributes in a context: the ids of the
// request or message being handled (correlation_id, message_id,
// aggregate_id, consumer_name). Code that logs with the *Context methods
// of log/slog (InfoContext, ...) under such a context writes lines that say
// what they are about, provided the process's slog handler adds Attrs(ctx)
// to each record (internal/telemetry's does).
package logctx

import (
	"context"
	"log/slog"
)

type key struct{}

// With returns a context whose log lines carry attrs, after those ctx
// carries already.
func With(ctx context.Context, attrs ...slog.Attr) context.Context {
	prev := Attrs(ctx)
	merged := make([]slog.Attr, 0, len(prev)+len(attrs))
	merged = append(merged, prev...)
	merged = append(merged, attrs...)
	return context.WithValue(ctx, key{}, merged)
}

// Attrs returns the attributes ctx carries.
func Attrs(ctx context.Context) []slog.Attr {
	attrs, _ := ctx.Value(key{}).([]slog.Attr)
	return attrs
}

// NewHandler returns a handler that adds Attrs(ctx) to each record it
// passes on to h.
func NewHandler(h slog.Handler) slog.Handler { return handler{h} }

type handler struct{ slog.Handler }

func (h handler) Handle(ctx context.Context, r slog.Record) error {
	r.AddAttrs(Attrs(ctx)...)
	return h.Handler.Handle(ctx, r)
}

func (h handler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return handler{h.Handler.WithAttrs(attrs)}
}

func (h handler) WithGroup(name string) slog.Handler { return handler{h.Handler.WithGroup(name)} }
