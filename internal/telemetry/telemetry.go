// Package telemetry sets up what every binary reports about itself, from
// OpenTelemetry's standard variables: traces (OTEL_TRACES_EXPORTER = otlp,
// console or none), metrics (OpenTelemetry instruments exported on /metrics
// through the Prometheus exporter), and logs (slog JSON on stdout, carrying
// the trace and span ids and the ids of what is being handled; also sent
// over OTLP with OTEL_LOGS_EXPORTER=otlp). The three processes call Setup
// once at start and Shutdown on exit, which flushes what is buffered.
//
// Whatever the exporters, traces are always recorded: the trace context is
// what travels in the outbox rows and the AMQP headers, and what ties the
// log lines of one order together.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"

	promclient "github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/contrib/bridges/otelslog"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlplog/otlploghttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	sdklog "go.opentelemetry.io/otel/sdk/log"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/yourorg/orders/internal/config"
)

// Telemetry is a process's logger, tracer and meter providers, and the
// /metrics handler that exposes the meters.
type Telemetry struct {
	Logger         *slog.Logger
	TracerProvider trace.TracerProvider
	MeterProvider  metric.MeterProvider
	// MetricsHandler serves every metric of the process in the Prometheus
	// text format.
	MetricsHandler http.Handler

	shutdown []func(context.Context) error
}

// Setup builds the telemetry of the process named service (OTEL_SERVICE_NAME
// overrides the name), writing logs (and console traces) to w. It installs
// the providers and the W3C trace-context and baggage propagator as the
// OpenTelemetry globals, for the libraries that instrument themselves.
func Setup(ctx context.Context, service string, cfg config.Telemetry, logCfg config.Log, w io.Writer) (*Telemetry, error) {
	if cfg.ServiceName != "" {
		service = cfg.ServiceName
	}
	res, err := resource.New(ctx,
		resource.WithFromEnv(), // OTEL_RESOURCE_ATTRIBUTES
		resource.WithTelemetrySDK(),
		resource.WithAttributes(semconv.ServiceName(service)),
	)
	if err != nil {
		return nil, fmt.Errorf("telemetry resource: %w", err)
	}
	t := &Telemetry{}

	// Traces.
	tp, err := newTracerProvider(ctx, cfg, res, w)
	if err != nil {
		return nil, err
	}
	t.TracerProvider = tp
	t.shutdown = append(t.shutdown, tp.Shutdown)
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))

	// Metrics, on /metrics.
	registry := promclient.NewRegistry()
	registry.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	exporter, err := prometheus.New(prometheus.WithRegisterer(registry), prometheus.WithoutScopeInfo())
	if err != nil {
		return nil, fmt.Errorf("prometheus exporter: %w", err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter), sdkmetric.WithResource(res))
	t.MeterProvider = mp
	t.shutdown = append(t.shutdown, mp.Shutdown)
	otel.SetMeterProvider(mp)

	// Logs: JSON (or text) on w, and over OTLP when asked.
	var extra []slog.Handler
	if cfg.LogsExporter == "otlp" {
		opts := []otlploghttp.Option{}
		if cfg.OTLPEndpoint != "" {
			opts = append(opts, otlploghttp.WithEndpointURL(strings.TrimRight(cfg.OTLPEndpoint, "/")+"/v1/logs"))
		}
		logExporter, err := otlploghttp.New(ctx, opts...)
		if err != nil {
			return nil, fmt.Errorf("otlp log exporter: %w", err)
		}
		lp := sdklog.NewLoggerProvider(sdklog.WithProcessor(sdklog.NewBatchProcessor(logExporter)), sdklog.WithResource(res))
		t.shutdown = append(t.shutdown, lp.Shutdown)
		extra = append(extra, otelslog.NewHandler(service, otelslog.WithLoggerProvider(lp)))
	}
	t.Logger = NewLogger(service, logCfg, w, extra...)
	t.MetricsHandler = promhttp.HandlerFor(registry, promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(t.Logger.Handler(), slog.LevelError)})
	return t, nil
}

func newTracerProvider(ctx context.Context, cfg config.Telemetry, res *resource.Resource, w io.Writer) (*sdktrace.TracerProvider, error) {
	opts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res)}
	switch cfg.TracesExporter {
	case "otlp":
		var (
			exp sdktrace.SpanExporter
			err error
		)
		if cfg.OTLPProtocol == "grpc" {
			var o []otlptracegrpc.Option
			if cfg.OTLPEndpoint != "" {
				o = append(o, otlptracegrpc.WithEndpointURL(cfg.OTLPEndpoint))
			}
			exp, err = otlptracegrpc.New(ctx, o...)
		} else {
			var o []otlptracehttp.Option
			if cfg.OTLPEndpoint != "" {
				o = append(o, otlptracehttp.WithEndpointURL(strings.TrimRight(cfg.OTLPEndpoint, "/")+"/v1/traces"))
			}
			exp, err = otlptracehttp.New(ctx, o...)
		}
		if err != nil {
			return nil, fmt.Errorf("otlp trace exporter: %w", err)
		}
		opts = append(opts, sdktrace.WithBatcher(exp))
	case "console":
		exp, err := stdouttrace.New(stdouttrace.WithWriter(w))
		if err != nil {
			return nil, fmt.Errorf("console trace exporter: %w", err)
		}
		opts = append(opts, sdktrace.WithSyncer(exp))
	}
	// none: spans are still recorded (and their context propagated), just
	// not exported.
	return sdktrace.NewTracerProvider(opts...), nil
}

// Shutdown flushes and stops every provider.
func (t *Telemetry) Shutdown(ctx context.Context) error {
	var errs []error
	for _, f := range t.shutdown {
		errs = append(errs, f(ctx))
	}
	return errors.Join(errs...)
}

// NewLogger returns the JSON (or text) logger of a process, at the
// configured level, with the service name on every line, and with the
// trace and span ids and the logctx attributes of the context of
// each *Context call, and every duration as a person reads it
// (readableDuration). Records also go to the extra handlers, unchanged.
func NewLogger(service string, cfg config.Log, w io.Writer, extra ...slog.Handler) *slog.Logger {
	opts := &slog.HandlerOptions{Level: cfg.SlogLevel(), ReplaceAttr: readableDuration}
	var h slog.Handler
	if cfg.Format == "text" {
		h = slog.NewTextHandler(w, opts)
	} else {
		h = slog.NewJSONHandler(w, opts)
	}
	h = h.WithAttrs([]slog.Attr{slog.String("service", service)})
	if len(extra) > 0 {
		h = slog.NewMultiHandler(append([]slog.Handler{h}, extra...)...)
	}
	return slog.New(contextHandler{h})
}
