// Package telemetry sets up what every binary reports about itself: the
// slog logger, and the OpenTelemetry meter provider exported on /metrics
// through the Prometheus exporter. The three processes call Setup once at
// start and Shutdown on exit, which flushes what is buffered.
package telemetry

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"

	promclient "github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"

	"github.com/yourorg/orders/internal/config"
)

// Telemetry is a process's logger and meters, and the /metrics handler
// that exposes the meters.
type Telemetry struct {
	Logger        *slog.Logger
	MeterProvider metric.MeterProvider
	// MetricsHandler serves every metric of the process in the Prometheus
	// text format.
	MetricsHandler http.Handler

	shutdown []func(context.Context) error
}

// Setup builds the telemetry of the process named service, logging to w.
// It also installs the meter provider as the OpenTelemetry global, for the
// libraries that instrument themselves (HTTP server, database pool).
func Setup(service string, logCfg config.Log, w io.Writer) (*Telemetry, error) {
	logger := NewLogger(service, logCfg, w)

	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(semconv.ServiceName(service)))
	if err != nil {
		return nil, err
	}
	registry := promclient.NewRegistry()
	registry.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	exporter, err := prometheus.New(prometheus.WithRegisterer(registry), prometheus.WithoutScopeInfo())
	if err != nil {
		return nil, err
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter), sdkmetric.WithResource(res))
	otel.SetMeterProvider(mp)

	return &Telemetry{
		Logger:         logger,
		MeterProvider:  mp,
		MetricsHandler: promhttp.HandlerFor(registry, promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(logger.Handler(), slog.LevelError)}),
		shutdown:       []func(context.Context) error{mp.Shutdown},
	}, nil
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
// configured level, with the service name on every line.
func NewLogger(service string, cfg config.Log, w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: cfg.SlogLevel()}
	var h slog.Handler
	if cfg.Format == "text" {
		h = slog.NewTextHandler(w, opts)
	} else {
		h = slog.NewJSONHandler(w, opts)
	}
	return slog.New(contextHandler{h}).With(slog.String("service", service))
}
