package app

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/yourorg/orders/internal/testenv"
)

// Healthcheck succeeds while the process's /readyz answers 200, and fails
// while it answers 503 or nothing listens, saying why in its output.
func TestHealthcheck(t *testing.T) {
	t.Parallel()
	addr := testenv.FreeAddr(t)
	_, port, _ := net.SplitHostPort(addr)
	listen := ":" + port // as ADMIN_ADDR says it: every interface
	if err := Healthcheck(t.Context(), listen, "/readyz", io.Discard); err == nil {
		t.Fatal("healthcheck succeeded with nothing listening")
	}
	var ready atomic.Bool
	admin := AdminHandler(func(context.Context) error {
		if !ready.Load() {
			return errors.New("not connected to RabbitMQ")
		}
		return nil
	}, http.NotFoundHandler())
	ctx, cancel := context.WithCancel(t.Context())
	listening := make(chan net.Addr, 1)
	errc := make(chan error, 1)
	go func() {
		errc <- Serve(ctx, NewHTTPServer(listen, admin, discardLogger()), time.Second, discardLogger(), listening)
	}()
	<-listening

	var out strings.Builder
	err := Healthcheck(t.Context(), listen, "/readyz", &out)
	if err == nil || !strings.Contains(out.String(), "not connected to RabbitMQ") {
		t.Fatalf("not ready: err = %v, output %q; want an error, and the reason in the output", err, out.String())
	}
	ready.Store(true)
	if err := Healthcheck(t.Context(), listen, "/readyz", io.Discard); err != nil {
		t.Fatalf("ready: %v", err)
	}
	cancel()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

func TestHealthcheckURL(t *testing.T) {
	t.Parallel()
	for addr, want := range map[string]string{
		":9102":          "http://127.0.0.1:9102/readyz",
		"0.0.0.0:9101":   "http://127.0.0.1:9101/readyz",
		"[::]:8080":      "http://127.0.0.1:8080/readyz",
		"10.0.0.7:8080":  "http://10.0.0.7:8080/readyz",
		"localhost:8080": "http://localhost:8080/readyz",
	} {
		if got, err := healthcheckURL(addr, "/readyz"); err != nil || got != want {
			t.Errorf("healthcheckURL(%q) = %q, %v; want %q", addr, got, err, want)
		}
	}
	if _, err := healthcheckURL("9102", "/readyz"); err == nil {
		t.Error("healthcheckURL accepted an address without a port")
	}
}
