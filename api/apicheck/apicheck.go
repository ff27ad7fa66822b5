// Package apicheck holds the HTTP API to its OpenAPI document in tests.
//
// Transport is an http.RoundTripper that checks every request a test sends
// and every answer the API gives, errors included, against
// api/openapi.yaml (with kin-openapi's openapi3filter), and fails the test
// on the first thing the document does not say:
//
//   - a request the document allows is answered with a status, headers
//     and a body the document gives for its operation and that status;
//   - a request the document does not allow (a missing bearer token, a bad
//     body, a parameter out of range or not listed) is refused with a 4XX
//     (401 for missing credentials), and that answer is one the document
//     gives;
//   - a request for a path or method the document does not have is a 404
//     or a 405, a problem+json one outside /ui/.
//
// Proxy puts the same check in front of a server for a process under test
// (the load generator, the walkthrough) that sends requests of its own.
//
// The API tests (internal/httpapi) and the end-to-end tests (test/e2e) send
// their traffic through it, so that the document is held to everything the
// API answers, not only to the routes it lists.
package apicheck

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"

	"github.com/yourorg/orders/api"
)

func init() {
	// The pages under /ui/ are described as text/html strings.
	openapi3filter.RegisterBodyDecoder("text/html", openapi3filter.PlainBodyDecoder)
}

// document is api/openapi.yaml, loaded and validated once per test binary.
var document = sync.OnceValues(func() (*checker, error) {
	doc, err := openapi3.NewLoader().LoadFromData(api.OpenAPI)
	if err != nil {
		return nil, fmt.Errorf("api/openapi.yaml: %w", err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		return nil, fmt.Errorf("api/openapi.yaml is not a valid OpenAPI document: %w", err)
	}
	doc.Servers = nil // match any host: the tests' servers listen on random ports
	router, err := legacy.NewRouter(doc)
	if err != nil {
		return nil, fmt.Errorf("api/openapi.yaml: %w", err)
	}
	problem := doc.Components.Schemas["Problem"]
	if problem == nil {
		return nil, errors.New("api/openapi.yaml has no Problem schema")
	}
	return &checker{router: router, problem: problem.Value}, nil
})

// checker checks exchanges against the document.
type checker struct {
	router  routers.Router
	problem *openapi3.Schema
}

// Check reports how one exchange departs from api/openapi.yaml, or nil
// when the document describes it. reqBody and respBody are the bodies
// of req and resp, read already (their Body fields are not used).
func Check(req *http.Request, reqBody []byte, resp *http.Response, respBody []byte) error {
	c, err := document()
	if err != nil {
		return err
	}
	return c.check(req, reqBody, resp, respBody)
}

func (c *checker) check(req *http.Request, reqBody []byte, resp *http.Response, respBody []byte) error {
	status := resp.StatusCode
	route, params, err := c.router.FindRoute(req)
	if err != nil {
		return c.checkNoRoute(req, resp, respBody, err)
	}
	name := fmt.Sprintf("%s (%s %s) -> %d", route.Operation.OperationID, req.Method, req.URL.Path, status)

	reqInput := &openapi3filter.RequestValidationInput{
		Request:    withBody(req, reqBody),
		PathParams: params,
		Route:      route,
		Options: &openapi3filter.Options{
			AuthenticationFunc:                authenticate,
			RejectWhenRequestBodyNotSpecified: true,
			SkipSettingDefaults:               true,
			MultiError:                        true,
		},
	}
	reqErr := openapi3filter.ValidateRequest(context.Background(), reqInput)
	if reqErr == nil {
		reqErr = unlistedQueryParameters(req, route)
	}
	if reqErr != nil {
		// The document says the request is wrong: the server must say so
		// too, with the status the document gives to the fault.
		var security *openapi3filter.SecurityRequirementsError
		switch {
		case errors.As(reqErr, &security) && status != http.StatusUnauthorized:
			return fmt.Errorf("%s: the request has none of the credentials the document asks for, yet the answer is not 401: %w", name, reqErr)
		case status < 400 || status > 499:
			return fmt.Errorf("%s: the document does not allow the request, yet the answer is not a 4XX: %w", name, reqErr)
		}
	}

	respInput := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: reqInput,
		Status:                 status,
		Header:                 resp.Header,
		Options:                &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true},
	}
	respInput.SetBodyBytes(respBody)
	if err := openapi3filter.ValidateResponse(context.Background(), respInput); err != nil {
		return fmt.Errorf("%s: the answer does not match the document: %w\nbody: %.2000s", name, err, respBody)
	}
	return nil
}

// checkNoRoute checks the answer to a request for a path or a method the
// document does not have: 404 or 405, with a problem+json body outside the
// HTML pages.
func (c *checker) checkNoRoute(req *http.Request, resp *http.Response, respBody []byte, routeErr error) error {
	status := resp.StatusCode
	if resp.Header.Get("X-Correlation-ID") == "" {
		return fmt.Errorf("%s %s -> %d: no X-Correlation-ID header (every answer has one)", req.Method, req.URL.Path, status)
	}
	if status != http.StatusNotFound && status != http.StatusMethodNotAllowed {
		return fmt.Errorf("%s %s -> %d: the document has no such operation (%w), yet the answer is not a 404 or 405", req.Method, req.URL.Path, status, routeErr)
	}
	mediaType, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	switch {
	case strings.HasPrefix(req.URL.Path, "/ui/") && mediaType == "text/html":
		return nil // an error page for people
	case mediaType != "application/problem+json":
		return fmt.Errorf("%s %s -> %d: Content-Type %q, want application/problem+json", req.Method, req.URL.Path, status, resp.Header.Get("Content-Type"))
	}
	value, err := decodeJSON(respBody)
	if err == nil {
		err = c.problem.VisitJSON(value, openapi3.VisitAsResponse())
	}
	if err != nil {
		return fmt.Errorf("%s %s -> %d: the body is not a Problem of the document: %w\nbody: %.2000s", req.Method, req.URL.Path, status, err, respBody)
	}
	return nil
}

// authenticate is the document's security schemes as a client sees them:
// the credentials are there. Whether a token verifies is the server's to
// say; the document only says that a 401 answers one that does not.
func authenticate(_ context.Context, in *openapi3filter.AuthenticationInput) error {
	req := in.RequestValidationInput.Request
	scheme := in.SecurityScheme
	switch {
	case scheme.Type == "http" && scheme.Scheme == "bearer":
		kind, token, ok := strings.Cut(req.Header.Get("Authorization"), " ")
		if !ok || !strings.EqualFold(kind, "Bearer") || strings.TrimSpace(token) == "" {
			return in.NewError(errors.New(`no "Authorization: Bearer <token>" header`))
		}
	case scheme.Type == "apiKey" && scheme.In == "cookie":
		if _, err := req.Cookie(scheme.Name); err != nil {
			return in.NewError(fmt.Errorf("no cookie %s", scheme.Name))
		}
	default:
		return in.NewError(fmt.Errorf("security scheme %s of type %s: apicheck does not know it", in.SecuritySchemeName, scheme.Type))
	}
	return nil
}

// unlistedQueryParameters reports a query parameter the operation does not
// list: the API refuses those (a 400 invalid_query), so the document must
// list every one it takes. openapi3filter ignores them.
func unlistedQueryParameters(req *http.Request, route *routers.Route) error {
	var listed []string
	for _, params := range []openapi3.Parameters{route.PathItem.Parameters, route.Operation.Parameters} {
		for _, p := range params {
			if p.Value != nil && p.Value.In == openapi3.ParameterInQuery {
				listed = append(listed, p.Value.Name)
			}
		}
	}
	for name := range req.URL.Query() {
		if !slices.Contains(listed, name) {
			return fmt.Errorf("query parameter %q is not one the operation lists", name)
		}
	}
	return nil
}

// withBody is a copy of req whose body reads body.
func withBody(req *http.Request, body []byte) *http.Request {
	out := req.Clone(context.Background())
	out.Body = io.NopCloser(bytes.NewReader(body))
	out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	out.ContentLength = int64(len(body))
	return out
}

func decodeJSON(body []byte) (any, error) {
	var v any
	err := json.Unmarshal(body, &v)
	return v, err
}

// Transport returns a RoundTripper that sends each request through next
// (http.DefaultTransport when nil) and fails t (Errorf: the test goes on)
// when the request or the answer departs from api/openapi.yaml, naming the
// operation, the status and the validator's message. The caller gets the
// answer as the server sent it.
func Transport(t testing.TB, next http.RoundTripper) http.RoundTripper {
	t.Helper()
	if _, err := document(); err != nil {
		t.Fatal(err)
	}
	if next == nil {
		next = http.DefaultTransport
	}
	return &transport{t: t, next: next}
}

type transport struct {
	t    testing.TB
	next http.RoundTripper
}

func (tr *transport) RoundTrip(req *http.Request) (*http.Response, error) {
	var reqBody []byte
	if req.Body != nil && req.Body != http.NoBody {
		var err error
		reqBody, err = io.ReadAll(req.Body)
		_ = req.Body.Close()
		if err != nil {
			return nil, err
		}
	}
	out := req.Clone(req.Context())
	if reqBody != nil {
		out.Body = io.NopCloser(bytes.NewReader(reqBody))
		out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(reqBody)), nil }
	}
	resp, err := tr.next.RoundTrip(out)
	if err != nil {
		return nil, err // no answer: nothing to check
	}
	respBody, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	resp.Body = io.NopCloser(bytes.NewReader(respBody))
	if err != nil {
		return resp, nil // the caller sees the cut answer; the check needs it whole
	}
	if err := Check(req, reqBody, resp, respBody); err != nil {
		tr.t.Errorf("api/openapi.yaml: %v", err)
	}
	return resp, nil
}

// Client is an http.Client whose every exchange is checked (Transport), and
// that gives up on a request after a minute: a server that hangs fails the
// test that waits for it, not the whole run.
func Client(t testing.TB) *http.Client {
	t.Helper()
	return &http.Client{Transport: Transport(t, nil), Timeout: time.Minute}
}

// Proxy starts a reverse proxy to target (a base URL) whose every exchange
// is checked (Transport), and returns its base URL: give it to a process
// under test in place of target. It stops at the end of the test.
func Proxy(t testing.TB, target string) string {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	proxy := &httputil.ReverseProxy{
		Rewrite:   func(r *httputil.ProxyRequest) { r.SetURL(u) },
		Transport: Transport(t, nil),
	}
	srv := httptest.NewServer(proxy)
	t.Cleanup(srv.Close)
	return srv.URL
}
