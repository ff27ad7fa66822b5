package httpapi_test

import (
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/yourorg/orders/internal/auth"
	"github.com/yourorg/orders/internal/httpapi"
)

// countingReader is a request body of n bytes, the first from prefix and
// the rest 'a', that counts what the client took of it: what the server
// read, plus at most what the sockets buffer between them.
type countingReader struct {
	prefix string
	n      int64
	read   atomic.Int64
}

func (r *countingReader) Read(p []byte) (int, error) {
	done := r.read.Load()
	if done >= r.n {
		return 0, io.EOF
	}
	p = p[:min(int64(len(p)), r.n-done)]
	for i := range p {
		if at := done + int64(i); at < int64(len(r.prefix)) {
			p[i] = r.prefix[at]
		} else {
			p[i] = 'a'
		}
	}
	r.read.Add(int64(len(p)))
	return len(p), nil
}

// POST /ui/login, open to anyone, reads at most 8 KiB of a form encoded as
// the page sends it (application/x-www-form-urlencoded): a larger form is
// a 413, any other encoding a 415 before the body is read, so that a
// multipart form of 256 MiB is neither read nor spilled to temporary files.
// A token in the query string is not taken.
func TestUISignInFormIsBounded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sameOrigin := header{"Sec-Fetch-Site": "same-origin"}
	// send posts body to /ui/login. The exchange is checked against
	// api/openapi.yaml (apicheck) unless streamed: the check reads the
	// whole body first, which is what a streamed one must not be.
	send := func(contentType string, body io.Reader, streamed bool) response {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, b.server.URL+"/ui/login", body)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", contentType)
		req.Header.Set("Sec-Fetch-Site", "same-origin")
		client := b.client
		if streamed {
			client = &http.Client{Timeout: time.Minute}
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("POST /ui/login (%s): %v", contentType, err)
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		return response{status: resp.StatusCode, header: resp.Header, body: out}
	}
	isPage := func(what string, r response, status int) {
		t.Helper()
		if r.status != status || r.header.Get("Set-Cookie") != "" || !strings.HasPrefix(r.header.Get("Content-Type"), "text/html") {
			t.Errorf("%s: %d %v, want a %d page and no cookie\n%s", what, r.status, r.header, status, r.body)
		}
	}

	// A token of 8 KiB and more, in the form the page sends: 413.
	token := b.token("alice", auth.RoleCustomer)
	big := url.Values{"token": {token + strings.Repeat("a", 8<<10)}}.Encode()
	isPage("a form of 8 KiB and more", send("application/x-www-form-urlencoded", strings.NewReader(big), false), http.StatusRequestEntityTooLarge)

	// A multipart form of 256 MiB: 415, and the server stops reading at once.
	const size = 256 << 20
	huge := &countingReader{n: size, prefix: "--B\r\nContent-Disposition: form-data; name=\"token\"\r\n\r\n" + token}
	isPage("a multipart form", send("multipart/form-data; boundary=B", huge, true), http.StatusUnsupportedMediaType)
	if read := huge.read.Load(); read > 32<<20 {
		t.Errorf("the client sent %d MiB of a 256 MiB multipart form before its answer: the server read it", read>>20)
	}
	isPage("a JSON body", send("application/json", strings.NewReader(`{"token":"`+token+`"}`), false), http.StatusUnsupportedMediaType)

	// The token in the query string, not the body: not taken.
	r := b.postForm(b.server.URL, "/ui/login?token="+url.QueryEscape(token), nil, sameOrigin)
	isPage("a token in the query string", r, http.StatusUnauthorized)

	// The form as the page sends it still signs in.
	signInCookie(t, b.postForm(b.server.URL, "/ui/login", url.Values{"token": {token}}, sameOrigin))
}

// Behind a proxy that ends TLS, requests arrive over plain HTTP, and the
// sign-in cookie must still be Secure: SecureCookie (order-api's
// API_PUBLIC_URL with https) makes it so, for sign-in and sign-out.
func TestUICookieSecureBehindATLSProxy(t *testing.T) {
	t.Parallel()
	b := setupWith(t, func(c *httpapi.Config, _ *httpapi.Deps) { c.SecureCookie = true })
	sameOrigin := header{"Sec-Fetch-Site": "same-origin"}
	in := signInCookie(t, b.postForm(b.server.URL, "/ui/login", url.Values{"token": {b.token("alice", auth.RoleCustomer)}}, sameOrigin))
	out := signInCookie(t, b.postForm(b.server.URL, "/ui/logout", nil, sameOrigin))
	if !strings.HasPrefix(b.server.URL, "http://") || !in.Secure || !out.Secure {
		t.Errorf("over %s with SecureCookie: sign-in cookie Secure %v, sign-out cookie Secure %v; want both", b.server.URL, in.Secure, out.Secure)
	}
}
