package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/domain"
	"github.com/yourorg/orders/internal/store"
)

// Problem is an RFC 9457 problem detail: the body of every error response.
// Code is a stable, machine-readable name for the problem; Errors lists the
// broken rules of a 422.
type Problem struct {
	Type          string              `json:"type"`
	Title         string              `json:"title"`
	Status        int                 `json:"status"`
	Detail        string              `json:"detail,omitempty"`
	Instance      string              `json:"instance,omitempty"`
	Code          string              `json:"code"`
	CorrelationID string              `json:"correlation_id,omitempty"`
	Errors        []domain.FieldError `json:"errors,omitempty"`
}

// apiError is an error a handler returns when it knows the response.
type apiError struct {
	status int
	code   string
	detail string
	err    error
}

func (e *apiError) Error() string {
	if e.err != nil {
		return e.detail + ": " + e.err.Error()
	}
	return e.detail
}

func (e *apiError) Unwrap() error { return e.err }

func newError(status int, code, detail string) *apiError {
	return &apiError{status: status, code: code, detail: detail}
}

// problemFor maps an error to its response: the one table from errors to
// HTTP statuses.
func problemFor(err error) Problem {
	var (
		apiErr   *apiError
		valErr   *domain.ValidationError
		echoErr  *echo.HTTPError
		maxBytes *http.MaxBytesError
	)
	switch {
	case errors.As(err, &apiErr):
		return problem(apiErr.status, apiErr.code, apiErr.detail)
	case errors.As(err, &valErr):
		p := problem(http.StatusUnprocessableEntity, "validation_failed", "The order breaks one or more rules; see errors.")
		p.Errors = valErr.Fields
		return p
	case errors.As(err, &maxBytes):
		return problem(http.StatusRequestEntityTooLarge, "body_too_large", "The request body is larger than 64 KiB.")
	case errors.Is(err, domain.ErrNotFound):
		return problem(http.StatusNotFound, "not_found", "No order has this id.")
	case errors.Is(err, domain.ErrStaleTransition), errors.Is(err, domain.ErrInvalidTransition):
		return problem(http.StatusConflict, "invalid_transition", err.Error())
	case errors.Is(err, domain.ErrConflict):
		return problem(http.StatusConflict, "conflict", "The order was changed by another request; read it and try again.")
	case errors.Is(err, store.ErrKeyInFlight):
		return problem(http.StatusConflict, "idempotency_key_in_use", "A request with this Idempotency-Key is still in progress; retry later.")
	case errors.Is(err, store.ErrKeyReused):
		return problem(http.StatusUnprocessableEntity, "idempotency_key_reused", "This Idempotency-Key was already used with a different request body.")
	case errors.As(err, &echoErr):
		return problem(echoErr.Code, echoCode(echoErr.Code), http.StatusText(echoErr.Code))
	case errors.Is(err, database.ErrCommitUnknown):
		return problem(http.StatusServiceUnavailable, "commit_outcome_unknown", "The connection to the database was lost while the change was being committed, "+
			"and the database could not say in time whether it was: it may have taken effect. Retry with the same Idempotency-Key, or read the order first.")
	case errors.Is(err, errOverloaded):
		return problem(http.StatusServiceUnavailable, "overloaded", "The server is at its limit; retry later.")
	case errors.Is(err, context.DeadlineExceeded):
		return problem(http.StatusServiceUnavailable, "timeout", "The request took too long; retry later.")
	case database.IsUnavailable(err):
		// The database is down, unreachable, read-only (a failover) or out
		// of disk: nothing was written, and the same request will work
		// once it is back. Not the request's fault, and not a bug.
		return problem(http.StatusServiceUnavailable, "database_unavailable", "The database cannot take the request right now; nothing was written. Retry later.")
	case database.IsFault(err):
		// Any other failure of the database's (a lock or statement timeout,
		// a statement a pooler's session refused): the transaction rolled
		// back. The request is not at fault and may work when retried; the
		// log says what to look into.
		return problem(http.StatusServiceUnavailable, "database_error", "The database failed the request; nothing was written. Retry later.")
	default:
		return problem(http.StatusInternalServerError, "internal", "The server failed to handle the request; it has been logged.")
	}
}

func problem(status int, code, detail string) Problem {
	return Problem{Type: "about:blank", Title: http.StatusText(status), Status: status, Detail: detail, Code: code}
}

func echoCode(status int) string {
	switch status {
	case http.StatusNotFound:
		return "not_found"
	case http.StatusMethodNotAllowed:
		return "method_not_allowed"
	case http.StatusRequestEntityTooLarge:
		return "body_too_large"
	case http.StatusUnsupportedMediaType:
		return "unsupported_media_type"
	}
	if status >= 500 {
		return "internal"
	}
	return "bad_request"
}

// retryAfterSeconds is the Retry-After of every 503: overload, a timeout,
// not ready.
const retryAfterSeconds = "1"

// errorHandler writes every error response of the API, and logs the
// failures that are the server's fault. The pages under /ui/ get their
// errors as HTML pages, with the same status.
func errorHandler(logger *slog.Logger) echo.HTTPErrorHandler {
	return func(err error, c echo.Context) {
		if c.Response().Committed {
			return
		}
		req := c.Request()
		p := problemFor(err)
		p.Instance = req.URL.Path
		p.CorrelationID = correlationID(req.Context())
		if p.Status == http.StatusServiceUnavailable {
			c.Response().Header().Set("Retry-After", retryAfterSeconds)
		}
		// A request turned away for overload is no failure to look into:
		// the metrics count the 503s, and its request line says 503.
		if p.Status >= http.StatusInternalServerError && !errors.Is(err, errOverloaded) {
			logger.ErrorContext(req.Context(), "request failed", slog.String("error", err.Error()),
				slog.String("method", req.Method), slog.String("route", c.Path()))
		}
		if isPage(req) {
			if err := renderErrorPage(c, p); err != nil {
				logger.ErrorContext(req.Context(), "error page failed", slog.String("error", err.Error()))
			}
			return
		}
		body, _ := json.Marshal(p)
		c.Response().Header().Set(echo.HeaderContentType, "application/problem+json")
		c.Response().WriteHeader(p.Status)
		if req.Method != http.MethodHead {
			_, _ = c.Response().Write(body)
		}
	}
}
