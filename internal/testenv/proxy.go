package testenv

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// Proxy is a TCP proxy in the test process (toxiproxy) between the code
// under test and a server, so that a test can cut or stall the connection
// without touching the shared server.
type Proxy struct {
	t     testing.TB
	proxy *toxiproxy.Proxy
}

// NewProxy starts a proxy to upstream ("host:port") on a free local port,
// stopped when t ends.
func NewProxy(t testing.TB, upstream string) *Proxy {
	t.Helper()
	server := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	p := toxiproxy.NewProxy(server, "test-"+randomSuffix(), "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		t.Fatalf("testenv: start proxy to %s: %v", upstream, err)
	}
	t.Cleanup(p.Stop)
	return &Proxy{t: t, proxy: p}
}

// Addr is where the proxy listens.
func (p *Proxy) Addr() string { return p.proxy.Listen }

// Rewrite returns rawURL (amqp:// or postgres://) with its host and port
// replaced by the proxy's.
func (p *Proxy) Rewrite(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		p.t.Fatalf("testenv: %v", err)
	}
	u.Host = p.Addr()
	return u.String()
}

// Cut closes every connection through the proxy and refuses new ones: the
// server is down, as far as the client can tell.
func (p *Proxy) Cut() { p.proxy.Stop() }

// Restore accepts connections again, on the same address.
func (p *Proxy) Restore() {
	p.t.Helper()
	if err := p.proxy.Start(); err != nil {
		p.t.Fatalf("testenv: restart proxy: %v", err)
	}
}

// Stall keeps connections open but lets no byte through in either
// direction: a black-holed network. Heal undoes it.
func (p *Proxy) Stall() {
	p.t.Helper()
	for _, stream := range []string{"upstream", "downstream"} {
		toxic := fmt.Sprintf(`{"name":"stall-%s","type":"timeout","stream":%q,"attributes":{"timeout":0}}`, stream, stream)
		if _, err := p.proxy.Toxics.AddToxicJson(strings.NewReader(toxic)); err != nil {
			p.t.Fatalf("testenv: stall proxy: %v", err)
		}
	}
}

// StallReplies lets every byte from the client through to the server, and
// none back: the server does what it is asked (a COMMIT commits), and the
// client never hears the answer. Heal undoes it.
func (p *Proxy) StallReplies() {
	p.t.Helper()
	toxic := `{"name":"stall-replies","type":"timeout","stream":"downstream","attributes":{"timeout":0}}`
	if _, err := p.proxy.Toxics.AddToxicJson(strings.NewReader(toxic)); err != nil {
		p.t.Fatalf("testenv: stall proxy replies: %v", err)
	}
}

// Slow delays every byte by d in each direction: a long, slow network.
// Heal undoes it.
func (p *Proxy) Slow(d time.Duration) {
	p.t.Helper()
	for _, stream := range []string{"upstream", "downstream"} {
		toxic := fmt.Sprintf(`{"name":"slow-%s","type":"latency","stream":%q,"attributes":{"latency":%d}}`, stream, stream, d.Milliseconds())
		if _, err := p.proxy.Toxics.AddToxicJson(strings.NewReader(toxic)); err != nil {
			p.t.Fatalf("testenv: slow proxy: %v", err)
		}
	}
}

// Heal removes Stall, StallReplies and Slow.
func (p *Proxy) Heal() { p.proxy.Toxics.ResetToxics(context.Background()) }

// HostPort returns the host:port of an amqp:// or postgres:// URL, with the
// scheme's default port when it names none.
func HostPort(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil || u.Port() != "" {
		return u.Host
	}
	if u.Scheme == "postgres" || u.Scheme == "postgresql" {
		return net.JoinHostPort(u.Hostname(), "5432")
	}
	return net.JoinHostPort(u.Hostname(), "5672")
}
