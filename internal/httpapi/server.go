package httpapi

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/yourorg/orders/api"
	"github.com/yourorg/orders/internal/auth"
	"github.com/yourorg/orders/internal/database"
)

// Config holds the knobs of the API. A zero field takes its default.
type Config struct {
	// IdempotencyKeyTTL is how long an Idempotency-Key is remembered.
	// Default 24h.
	IdempotencyKeyTTL time.Duration
	// AcquireTimeout bounds the wait of a request for a database
	// connection; past it the request is a 503 with Retry-After. Default 1s.
	AcquireTimeout time.Duration
	// MaxInFlight caps the requests handled at once; one more is a 503
	// with Retry-After at once. /healthz, /readyz and /metrics are not
	// counted. Default 100.
	MaxInFlight int
	// JaegerUIURL, when set, is where the order timeline page links the
	// order's trace: JaegerUIURL + "/trace/" + the trace id. Default: no
	// link, the trace id only.
	JaegerUIURL string
	// SecureCookie makes the /ui/ sign-in cookie Secure (sent over HTTPS
	// only) whatever the request's own scheme: for an API whose clients
	// reach it over HTTPS through a proxy or load balancer that ends TLS
	// and forwards plain HTTP. The cookie is Secure anyway when TLS ends in
	// this process. Default false.
	SecureCookie bool
}

func (c *Config) setDefaults() {
	if c.IdempotencyKeyTTL == 0 {
		c.IdempotencyKeyTTL = 24 * time.Hour
	}
	if c.AcquireTimeout == 0 {
		c.AcquireTimeout = time.Second
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = 100
	}
	c.JaegerUIURL = strings.TrimRight(c.JaegerUIURL, "/")
}

// Deps is what the API runs on.
type Deps struct {
	Pool *pgxpool.Pool
	// Verifier tells who calls (internal/auth); required, so that an API
	// without authentication is asked for: auth.Off().
	Verifier       *auth.Verifier
	Logger         *slog.Logger
	TracerProvider trace.TracerProvider
	MeterProvider  metric.MeterProvider
	// MetricsHandler serves GET /metrics.
	MetricsHandler http.Handler
	// ShuttingDown is closed when the process starts to shut down: from
	// then on /readyz answers 503 and every answer closes its connection,
	// while the requests in flight finish. Nil: never.
	ShuttingDown <-chan struct{}
}

// Server holds the handlers of the API.
type Server struct {
	cfg          Config
	pool         *pgxpool.Pool
	db           boundedPool // the handlers' transactions
	logger       *slog.Logger
	verifier     *auth.Verifier
	metrics      apiMetrics
	shuttingDown <-chan struct{}
}

type apiMetrics struct {
	created, cancelled, replays metric.Int64Counter
	refusals                    metric.Int64Counter
}

// New returns the API as an http.Handler, with every route of docs/contract.md,
// and the order timeline pages under /ui/.
func New(cfg Config, deps Deps) (*echo.Echo, error) {
	cfg.setDefaults()
	if deps.Verifier == nil {
		return nil, errors.New("httpapi: no Verifier in Deps (auth.Off() turns authentication off)")
	}
	m, err := newAPIMetrics(deps.MeterProvider.Meter("github.com/yourorg/orders/internal/httpapi"))
	if err != nil {
		return nil, err
	}
	s := &Server{
		cfg: cfg, pool: deps.Pool, logger: deps.Logger, verifier: deps.Verifier, metrics: m, shuttingDown: deps.ShuttingDown,
		db: boundedPool{pool: deps.Pool, acquireTimeout: cfg.AcquireTimeout},
	}

	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.HTTPErrorHandler = errorHandler(deps.Logger)
	e.Use(
		closeWhenShuttingDown(deps.ShuttingDown),
		withCorrelationID,
		logRequests(deps.Logger),
		instrument(deps.TracerProvider, deps.MeterProvider),
		limitInFlight(cfg.MaxInFlight, "/healthz", "/readyz", "/metrics"),
		middleware.RecoverWithConfig(middleware.RecoverConfig{
			DisableErrorHandler: true, // return the panic as an error, rendered as a 500 above
			LogErrorFunc: func(c echo.Context, err error, stack []byte) error {
				deps.Logger.ErrorContext(c.Request().Context(), "handler panicked",
					slog.String("error", err.Error()), slog.String("stack", string(stack)))
				return err
			},
		}),
	)

	// Every route of the API and the pages needs a caller (authn.go).
	e.POST("/v1/orders", s.createOrder, s.authenticate)
	e.GET("/v1/orders", s.listOrders, s.authenticate)
	e.GET("/v1/orders/:order_id", s.getOrder, s.authenticate)
	e.POST("/v1/orders/:order_id/cancel", s.cancelOrder, s.authenticate)

	// The order timeline pages, HTML for people (ui.go), and the sign-in
	// page that turns a token into a cookie for them (authn.go).
	e.GET("/ui/", s.uiOrders, s.authenticate)
	e.GET("/ui/orders/:order_id", s.uiOrder, s.authenticate)
	e.GET("/ui/login", s.uiLoginForm)
	e.POST("/ui/login", s.uiLogin)
	e.POST("/ui/logout", s.uiLogout)

	e.GET("/healthz", s.healthz)
	e.GET("/readyz", s.readyz)
	e.GET("/metrics", echo.WrapHandler(deps.MetricsHandler))
	e.GET("/openapi.yaml", serveOpenAPI)
	e.GET("/asyncapi.yaml", serveAsyncAPI)
	return e, nil
}

func newAPIMetrics(meter metric.Meter) (apiMetrics, error) {
	var m apiMetrics
	var err error
	if m.created, err = meter.Int64Counter("orders.created",
		metric.WithDescription("Orders accepted by POST /v1/orders (idempotent replays not counted)."),
		metric.WithUnit("{order}")); err != nil {
		return m, err
	}
	if m.cancelled, err = meter.Int64Counter("orders.cancelled",
		metric.WithDescription("Orders moved to CANCELLED by POST /v1/orders/{order_id}/cancel."),
		metric.WithUnit("{order}")); err != nil {
		return m, err
	}
	if m.replays, err = meter.Int64Counter("orders.idempotent_replays",
		metric.WithDescription("POST /v1/orders answered from a stored response (Idempotency-Key replay)."),
		metric.WithUnit("{request}")); err != nil {
		return m, err
	}
	if m.refusals, err = meter.Int64Counter("http.auth.refusals",
		metric.WithDescription("Requests refused for who sent them, by reason: no or a bad token (401), a role or rule that forbids it (403)."),
		metric.WithUnit("{request}")); err != nil {
		return m, err
	}
	// Start at zero, so that rate() and alerts see a series from the start.
	for _, c := range []metric.Int64Counter{m.created, m.cancelled, m.replays} {
		c.Add(context.Background(), 0)
	}
	for _, reason := range append(slices.Clone(auth.Reasons), reasonOtherCustomer) {
		m.refusals.Add(context.Background(), 0, metric.WithAttributes(attribute.String("reason", reason)))
	}
	return m, nil
}

// healthz: the process is alive.
func (s *Server) healthz(c echo.Context) error {
	return c.JSON(http.StatusOK, map[string]string{"status": "ok"})
}

// readyz: the process can serve, which for the API means it is not
// shutting down and the database answers.
func (s *Server) readyz(c echo.Context) error {
	select {
	case <-s.shuttingDown:
		return newError(http.StatusServiceUnavailable, "shutting_down", "The server is shutting down.")
	default:
	}
	ctx, cancel := context.WithTimeout(c.Request().Context(), 2*time.Second)
	defer cancel()
	if err := database.Ping(ctx, s.pool); err != nil {
		if database.IsUnavailable(err) {
			return newError(http.StatusServiceUnavailable, "not_ready", "The database is failing over or down: no server takes writes.")
		}
		return newError(http.StatusServiceUnavailable, "not_ready", "The database does not answer.")
	}
	return c.JSON(http.StatusOK, map[string]string{"status": "ready"})
}

func serveOpenAPI(c echo.Context) error {
	return c.Blob(http.StatusOK, "application/yaml", api.OpenAPI)
}

// serveAsyncAPI serves the AsyncAPI document of the messages the API's
// orders cause, for the teams that consume them.
func serveAsyncAPI(c echo.Context) error {
	return c.Blob(http.StatusOK, "application/yaml", api.AsyncAPI)
}
