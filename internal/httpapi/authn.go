package httpapi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"mime"
	"net/http"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/labstack/echo/v4"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/yourorg/orders/internal/auth"
	"github.com/yourorg/orders/internal/store"
)

// Who may do what (README, "Authentication"): every route under /v1/ and
// /ui/ needs a caller, verified by internal/auth from a bearer token; the
// handlers then apply the rules of the caller's role with caller(ctx):
//
//   - a customer creates orders for itself only (403 otherwise), and
//     reads, lists and cancels its own orders only: another customer's
//     order is a 404, exactly as an unknown id, so that no answer tells
//     that the order exists;
//   - an operator sees and cancels every order.
//
// /healthz, /readyz, /metrics, /openapi.yaml and /asyncapi.yaml need no
// caller.

// uiTokenCookie holds the token of a browser signed in at /ui/login.
//
// CSRF: the cookie is honoured only on GET and HEAD under /ui/, and every
// /ui/ page only reads. No request that changes anything (/v1/, any POST)
// takes it: those need the Authorization header, which a browser never adds
// by itself. So a forged cross-site request could at most fetch a page its
// sender cannot read; SameSite=Strict keeps the cookie off cross-site
// requests besides. The two forms that set and clear it (POST /ui/login and
// /ui/logout) are refused from another origin.
const uiTokenCookie = "orders_ui_token"

// reasonOtherCustomer is the refusal of a customer creating another
// customer's order (403), beside auth.Reasons.
const reasonOtherCustomer = "other_customer"

type callerKey struct{}

// caller is the verified caller of the request; authenticate put it there.
func caller(ctx context.Context) auth.Principal {
	p, _ := ctx.Value(callerKey{}).(auth.Principal)
	return p
}

// authenticate lets through a request whose bearer token verifies, with its
// caller in the context; it answers every other one 401 (403 for a valid
// token with an unknown role). The token comes from the Authorization
// header, or, for the GET pages of /ui/ only, from the sign-in cookie.
func (s *Server) authenticate(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		req := c.Request()
		var p auth.Principal
		if s.verifier.IsOff() {
			p, _ = s.verifier.Verify("")
		} else {
			token, err := bearerToken(req)
			if err != nil {
				return s.refuse(c, auth.Refuse("malformed", err))
			}
			if token == "" {
				return s.refuse(c, auth.Refuse("missing", errors.New("no bearer token")))
			}
			if p, err = s.verifier.Verify(token); err != nil {
				var refusal *auth.Refusal
				if !errors.As(err, &refusal) {
					return err
				}
				return s.refuse(c, refusal)
			}
		}
		c.SetRequest(req.WithContext(context.WithValue(req.Context(), callerKey{}, p)))
		return next(c)
	}
}

// bearerToken returns the token of the request: the Authorization header's
// (which must then be "Bearer <token>"), else, on a GET or HEAD of /ui/,
// the sign-in cookie's; "" when there is none.
func bearerToken(req *http.Request) (string, error) {
	if h := req.Header.Get(echo.HeaderAuthorization); h != "" {
		scheme, token, ok := strings.Cut(h, " ")
		if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(token) == "" {
			return "", errors.New(`the Authorization header is not "Bearer <token>"`)
		}
		return strings.TrimSpace(token), nil
	}
	if isPage(req) && (req.Method == http.MethodGet || req.Method == http.MethodHead) {
		if cookie, err := req.Cookie(uiTokenCookie); err == nil {
			return cookie.Value, nil
		}
	}
	return "", nil
}

// refuse counts and logs a refused request, never with its token, and
// returns the 401 or 403 the client gets.
func (s *Server) refuse(c echo.Context, r *auth.Refusal) error {
	req := c.Request()
	ctx := req.Context()
	s.metrics.refusals.Add(ctx, 1, metric.WithAttributes(attribute.String("reason", r.Reason)))
	s.logger.InfoContext(ctx, "request refused", slog.String("reason", r.Reason),
		slog.String("method", req.Method), slog.String("route", c.Path()), slog.String("error", r.Error()))
	if r.Forbidden() {
		return newError(http.StatusForbidden, "forbidden", "The token's role is neither customer nor operator.")
	}
	signIn := ""
	if isPage(req) {
		signIn = " Sign in at /ui/login."
	}
	if r.Reason == "missing" {
		c.Response().Header().Set(echo.HeaderWWWAuthenticate, "Bearer")
		return newError(http.StatusUnauthorized, "unauthenticated", "This needs a bearer token: Authorization: Bearer <token>."+signIn)
	}
	c.Response().Header().Set(echo.HeaderWWWAuthenticate, fmt.Sprintf(`Bearer error="invalid_token", error_description=%q`, r.Reason))
	return newError(http.StatusUnauthorized, "invalid_token", fmt.Sprintf("The bearer token is not valid (%s).", r.Reason)+signIn)
}

// forbid counts and logs a valid caller turned away by a rule of its role,
// and returns the 403.
func (s *Server) forbid(c echo.Context, reason, detail string) error {
	ctx := c.Request().Context()
	s.metrics.refusals.Add(ctx, 1, metric.WithAttributes(attribute.String("reason", reason)))
	s.logger.InfoContext(ctx, "request refused", slog.String("reason", reason),
		slog.String("method", c.Request().Method), slog.String("route", c.Path()), slog.String("caller", caller(ctx).Subject))
	return newError(http.StatusForbidden, "forbidden", detail)
}

// errHidden is the answer to a customer about another customer's order:
// the 404 of an unknown id, word for word. Not counted as a refusal:
// /metrics is open, and a counter that moved would tell that the order
// exists.
var errHidden = newError(http.StatusNotFound, "not_found", "No order has this id.")

// hideOthers is errHidden when the caller is a customer and the order is
// another's; domain.ErrNotFound when there is no such order. It reads the
// order's customer only, before anything else, so that another's order
// costs the same as an unknown one.
func hideOthers(ctx context.Context, tx pgx.Tx, id uuid.UUID) error {
	p := caller(ctx)
	if p.Operator() {
		return nil
	}
	customerID, err := store.OrderCustomer(ctx, tx, id)
	if err != nil {
		return err
	}
	if !p.Owns(customerID) {
		return errHidden
	}
	return nil
}

type loginPage struct {
	Caller *auth.Principal // nil: not signed in
}

// uiLoginForm: GET /ui/login, the form to paste a token into.
func (s *Server) uiLoginForm(c echo.Context) error {
	if err := onlyQueryParams(c); err != nil {
		return err
	}
	page := loginPage{}
	if token, err := bearerToken(c.Request()); err == nil && token != "" && !s.verifier.IsOff() {
		if p, err := s.verifier.Verify(token); err == nil {
			page.Caller = &p
		}
	}
	return renderPage(c, http.StatusOK, "login.html", page)
}

// uiLogin: POST /ui/login with the form's token. A token that verifies is
// set as the sign-in cookie, until the token expires; the browser goes on
// to /ui/. Any other is the 401 of the API, as a page.
func (s *Server) uiLogin(c echo.Context) error {
	if err := sameOrigin(c); err != nil {
		return err
	}
	token, err := readLoginForm(c)
	if err != nil {
		return err
	}
	token = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(token), "Bearer "))
	if token == "" {
		return s.refuse(c, auth.Refuse("missing", errors.New("the sign-in form has no token")))
	}
	if _, err := s.verifier.Verify(token); err != nil {
		var refusal *auth.Refusal
		if !errors.As(err, &refusal) {
			return err
		}
		return s.refuse(c, refusal)
	}
	cookie := &http.Cookie{
		Name: uiTokenCookie, Value: token, Path: "/ui",
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: s.secureCookie(c),
	}
	var claims jwt.RegisteredClaims // verified above; only its expiry is read here
	if _, _, err := jwt.NewParser().ParseUnverified(token, &claims); err == nil && claims.ExpiresAt != nil {
		cookie.Expires = claims.ExpiresAt.Time
	}
	c.SetCookie(cookie)
	return c.Redirect(http.StatusSeeOther, "/ui/")
}

// maxLoginFormBytes bounds the body of POST /ui/login: the form holds one
// token, and the largest tokens identity providers issue are a few KiB.
// The page is open to anyone, so nothing is read before this bound is set.
const maxLoginFormBytes = 8 << 10

// readLoginForm returns the token of the sign-in form, which must be
// application/x-www-form-urlencoded, the encoding of the page's form (415
// otherwise: a multipart body would be read whole, spilling to temporary
// files, before anything checks it), of at most maxLoginFormBytes (413).
// The token is taken from the body only, never from the query string,
// where it would end up in logs and the browser's history.
func readLoginForm(c echo.Context) (string, error) {
	req := c.Request()
	mediaType, _, err := mime.ParseMediaType(req.Header.Get(echo.HeaderContentType))
	if err != nil || mediaType != echo.MIMEApplicationForm {
		return "", newError(http.StatusUnsupportedMediaType, "unsupported_media_type",
			"The sign-in form must be sent as application/x-www-form-urlencoded.")
	}
	req.Body = http.MaxBytesReader(c.Response(), req.Body, maxLoginFormBytes)
	if err := req.ParseForm(); err != nil {
		if tooLarge := (*http.MaxBytesError)(nil); errors.As(err, &tooLarge) {
			return "", newError(http.StatusRequestEntityTooLarge, "body_too_large",
				fmt.Sprintf("The sign-in form is larger than %d KiB.", maxLoginFormBytes>>10))
		}
		return "", newError(http.StatusBadRequest, "bad_request", "The sign-in form could not be read.")
	}
	return req.PostForm.Get("token"), nil
}

// uiLogout: POST /ui/logout clears the sign-in cookie.
func (s *Server) uiLogout(c echo.Context) error {
	if err := sameOrigin(c); err != nil {
		return err
	}
	c.SetCookie(&http.Cookie{
		Name: uiTokenCookie, Value: "", Path: "/ui", MaxAge: -1, Expires: time.Unix(0, 0),
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: s.secureCookie(c),
	})
	return c.Redirect(http.StatusSeeOther, "/ui/login")
}

// secureCookie tells whether the sign-in cookie is Secure: over TLS, and
// whenever the API is configured to be reached over HTTPS (TLS ends in a
// proxy in front of it), where the request itself arrives as plain HTTP.
func (s *Server) secureCookie(c echo.Context) bool {
	return c.IsTLS() || s.cfg.SecureCookie
}

// crossOrigin refuses the forms posted from another site (Sec-Fetch-Site,
// Origin): nobody else's page may sign a browser in or out.
var crossOrigin = http.NewCrossOriginProtection()

func sameOrigin(c echo.Context) error {
	if err := crossOrigin.Check(c.Request()); err != nil {
		return newError(http.StatusForbidden, "cross_origin", "This form may only be sent from the pages of this server.")
	}
	return nil
}
