package app

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"
)

// HealthcheckCommand is the usage line of the healthcheck sub-command
// every service binary has (Start runs it).
const HealthcheckCommand = "healthcheck                  exit 0 when this process's /readyz answers 200, else 1 (a container's health check)"

// healthcheckTimeout bounds the whole check: a process that takes longer to
// answer is not healthy.
const healthcheckTimeout = 5 * time.Second

// Readiness is what a service's configuration tells the healthcheck
// sub-command: the address the process serves /readyz on (ADMIN_ADDR,
// HTTP_ADDR).
type Readiness interface {
	ReadyzAddr() string
}

// Healthcheck GETs path (/readyz) on the process that listens on addr,
// from inside its own container or host, and reports an error unless it
// answers 200: the images are distroless, with no shell, curl or wget, so
// docker compose's health checks run the binary itself (`order-consumer
// healthcheck`). An address with no host or an unspecified one (":9102",
// "0.0.0.0:9102") is reached on the loopback interface. The answer's body
// is printed to out, which docker keeps in the container's health log.
func Healthcheck(ctx context.Context, addr, path string, out io.Writer) error {
	url, err := healthcheckURL(addr, path)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, healthcheckTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("healthcheck: %w", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	_, _ = fmt.Fprintf(out, "GET %s: %d %s\n", url, resp.StatusCode, strings.TrimSpace(string(body)))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("healthcheck: GET %s answered %d, not ready", url, resp.StatusCode)
	}
	return nil
}

// healthcheckURL is the URL of path on the server listening on addr.
func healthcheckURL(addr, path string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("healthcheck: the listen address %q: %w", addr, err)
	}
	if host == "" || net.ParseIP(host) != nil && net.ParseIP(host).IsUnspecified() {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port) + path, nil
}
