package httpapi

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/labstack/echo/v4"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/yourorg/orders/internal/logctx"
)

// HeaderCorrelationID carries the id that ties a request to every message
// and log line it causes.
const HeaderCorrelationID = "X-Correlation-ID"

const maxCorrelationIDLen = 128

type correlationKey struct{}

func correlationID(ctx context.Context) string {
	id, _ := ctx.Value(correlationKey{}).(string)
	return id
}

// withCorrelationID takes the caller's X-Correlation-ID when it is sane
// (1..128 printable ASCII characters), or makes one up, and echoes it in the
// response.
func withCorrelationID(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		req := c.Request()
		id := req.Header.Get(HeaderCorrelationID)
		if !printableASCII(id, maxCorrelationIDLen) {
			id = uuid.NewString()
		}
		ctx := context.WithValue(req.Context(), correlationKey{}, id)
		ctx = logctx.With(ctx, slog.String("correlation_id", id))
		c.SetRequest(req.WithContext(ctx))
		c.Response().Header().Set(HeaderCorrelationID, id)
		return next(c)
	}
}

// printableASCII reports whether s has 1..maxLen characters, each a
// printable ASCII character (space to tilde).
func printableASCII(s string, maxLen int) bool {
	if len(s) == 0 || len(s) > maxLen {
		return false
	}
	for i := range len(s) {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// closeWhenShuttingDown stops keeping connections alive once the process
// is shutting down (SIGTERM): every answer says "Connection: close", and
// net/http closes the connection after it. During SHUTDOWN_DELAY the API
// still serves, and a client that still sends here (its load balancer has
// not seen /readyz yet) opens a new connection for its next request, which
// a balancer can send elsewhere; when the API then stops serving, no
// client is about to send on a connection it closes (app.Serve).
func closeWhenShuttingDown(shuttingDown <-chan struct{}) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			// As the answer is written: a request in flight when the
			// shutdown starts is answered so too.
			c.Response().Before(func() {
				select {
				case <-shuttingDown:
					c.Response().Header().Set(echo.HeaderConnection, "close")
				default:
				}
			})
			return next(c)
		}
	}
}

// logRequests writes one line per request, after the response.
func logRequests(logger *slog.Logger) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			start := time.Now()
			err := next(c)
			if err != nil { // not rendered by an inner middleware: render now
				c.Error(err)
			}
			req, status := c.Request(), c.Response().Status
			level := slog.LevelInfo
			switch {
			case status == http.StatusServiceUnavailable: // overload, not ready: the client retries
				level = slog.LevelWarn
			case status >= http.StatusInternalServerError:
				level = slog.LevelError
			}
			logger.Log(req.Context(), level, "http request",
				slog.String("method", req.Method),
				slog.String("route", c.Path()),
				slog.Int("status", status),
				slog.Duration("took", time.Since(start)))
			return nil
		}
	}
}

// instrument wraps the route in an OpenTelemetry HTTP server span named
// "METHOD /route/{param}" and records the HTTP server metrics. Errors are
// rendered inside the span so that the status it records is the one sent.
//
// The metrics are labelled with the method, the status, and the route
// template (none for a path that matches no route), never with what the
// client chose: otelhttp would take server.address and server.port from the
// Host header, so a client could add a series per Host it sends. It is
// given the request without its Host; the handler gets the request as sent.
//
// What a client sends of a trace shapes nothing here: the API is a public
// edge, reached by customers' programs.
//   - A traceparent is not taken as the parent: each request starts a trace
//     of its own (its own sampling decision), with a link to the caller's
//     span, so that a client can neither choose the trace id of its order
//     (and mix other orders into one trace) nor switch sampling on or off.
//     The caller's trace still leads to it through the link. An API behind
//     a gateway you trust, whose traces should continue, returns false from
//     the WithPublicEndpointFn below.
//   - Baggage is not read at all: whatever a client puts there would be
//     stored in every outbox row the request writes and travel on with
//     every message that follows (up to 8 KiB each).
func instrument(tp trace.TracerProvider, mp metric.MeterProvider) echo.MiddlewareFunc {
	otelMiddleware := otelhttp.NewMiddleware("http.server",
		otelhttp.WithTracerProvider(tp),
		otelhttp.WithMeterProvider(mp),
		otelhttp.WithPropagators(propagation.TraceContext{}),
		otelhttp.WithPublicEndpointFn(func(*http.Request) bool { return true }),
		otelhttp.WithSpanNameFormatter(func(_ string, r *http.Request) string {
			if r.Pattern == "" {
				return r.Method
			}
			return r.Method + " " + r.Pattern
		}),
	)
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			sent := c.Request()
			measured := sent.WithContext(sent.Context()) // a shallow copy
			measured.Host = ""
			otelMiddleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				// r is what the metrics are recorded from, after the handler.
				r.Pattern = routeTemplate(c.Path())
				handled := r.WithContext(r.Context())
				handled.Host = sent.Host
				c.SetRequest(handled)
				c.Response().Writer = w
				if err := next(c); err != nil {
					c.Error(err)
				}
			})).ServeHTTP(c.Response().Writer, measured)
			return nil
		}
	}
}

// limitInFlight answers 503 at once to a request that arrives while
// maxInFlight others are being handled, except on the routes in exempt (the probes and
// the metrics, which must answer under load).
func limitInFlight(maxInFlight int, exempt ...string) echo.MiddlewareFunc {
	slots := make(chan struct{}, maxInFlight)
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			if slices.Contains(exempt, c.Path()) {
				return next(c)
			}
			select {
			case slots <- struct{}{}:
				defer func() { <-slots }()
				return next(c)
			default:
				return fmt.Errorf("%d requests in flight already: %w", maxInFlight, errOverloaded)
			}
		}
	}
}

// routeTemplate turns Echo's "/v1/orders/:order_id" into the OpenAPI and
// OpenTelemetry form "/v1/orders/{order_id}".
func routeTemplate(echoPath string) string {
	parts := strings.Split(echoPath, "/")
	for i, p := range parts {
		if strings.HasPrefix(p, ":") {
			parts[i] = "{" + p[1:] + "}"
		}
	}
	return strings.Join(parts, "/")
}
