package telemetry

import (
	"context"

	"github.com/exaring/otelpgx"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// DBTracer traces the queries of a pool (otelpgx) when they run inside a
// trace: the queries of a request or of a message become spans of its
// trace. Queries outside any trace (the relay's polling, housekeeping)
// make no spans, so that they do not bury the traces that matter.
func DBTracer(tp trace.TracerProvider) pgx.QueryTracer {
	return inTraceOnly{otelpgx.NewTracer(otelpgx.WithTracerProvider(tp), otelpgx.WithDisableAcquireTracer())}
}

// RecordPoolStats reports the pool's statistics (connections acquired,
// idle, waited for) as metrics.
func RecordPoolStats(pool *pgxpool.Pool, mp metric.MeterProvider) error {
	return otelpgx.RecordStats(pool, otelpgx.WithStatsMeterProvider(mp))
}

type inTraceOnly struct{ t *otelpgx.Tracer }

type skippedKey struct{}

func inTrace(ctx context.Context) bool { return trace.SpanContextFromContext(ctx).IsValid() }

func (w inTraceOnly) TraceQueryStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if !inTrace(ctx) {
		return context.WithValue(ctx, skippedKey{}, true)
	}
	return w.t.TraceQueryStart(ctx, conn, data)
}

func (w inTraceOnly) TraceQueryEnd(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryEndData) {
	if ctx.Value(skippedKey{}) == nil {
		w.t.TraceQueryEnd(ctx, conn, data)
	}
}

func (w inTraceOnly) TraceBatchStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceBatchStartData) context.Context {
	if !inTrace(ctx) {
		return context.WithValue(ctx, skippedKey{}, true)
	}
	return w.t.TraceBatchStart(ctx, conn, data)
}

func (w inTraceOnly) TraceBatchQuery(ctx context.Context, conn *pgx.Conn, data pgx.TraceBatchQueryData) {
	if ctx.Value(skippedKey{}) == nil {
		w.t.TraceBatchQuery(ctx, conn, data)
	}
}

func (w inTraceOnly) TraceBatchEnd(ctx context.Context, conn *pgx.Conn, data pgx.TraceBatchEndData) {
	if ctx.Value(skippedKey{}) == nil {
		w.t.TraceBatchEnd(ctx, conn, data)
	}
}
