package messaging_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/yourorg/orders/internal/messaging"
	"github.com/yourorg/orders/internal/testenv"
)

// AMQP_URL is one URL or the URLs of a cluster's nodes; anything else
// fails with a message that says what is wrong and never shows a password.
func TestURLs(t *testing.T) {
	t.Parallel()
	good := []struct {
		in   string
		want []string
	}{
		{"amqp://guest:guest@127.0.0.1:5672/", []string{"amqp://guest:guest@127.0.0.1:5672/"}},
		{"amqp://u:hunter2@rabbitmq-1:5672/orders, amqp://u:hunter2@rabbitmq-2:5672/orders,amqp://u:hunter2@rabbitmq-3/orders",
			[]string{"amqp://u:hunter2@rabbitmq-1:5672/orders", "amqp://u:hunter2@rabbitmq-2:5672/orders", "amqp://u:hunter2@rabbitmq-3/orders"}},
		{"amqp://u:hunter2@a:5672,amqp://u:hunter2@b:5672/", []string{"amqp://u:hunter2@a:5672", "amqp://u:hunter2@b:5672/"}}, // both the default vhost
	}
	for _, c := range good {
		got, err := messaging.URLs(c.in)
		if err != nil || strings.Join(got, " ") != strings.Join(c.want, " ") {
			t.Errorf("URLs(%q) = %q, %v; want %q", c.in, got, err, c.want)
		}
	}
	bad := []struct{ in, want string }{
		{"", "no URL"},
		{"  ", "no URL"},
		{"amqp://u:hunter2@a:5672/,", "URL 2 of 2 is empty"},
		{"http://u:hunter2@a:5672/", "URL 1 of 1: want amqp://"},
		{"amqp://u:hunter2@a:5672/,a:5672", "URL 2 of 2: want amqp://"},
		{"amqp://u:hunter2@a:port/", "URL 1 of 1"},
		{"amqp://u:hunter2%zz@a:5672/", "URL 1 of 1"},
		{"amqp://u:hunter2@a:5672/v,amqp://x:hunter2@b:5672/v", `URL 2 of 2 differs from the first in more than host and port (user "x", not "u")`},
		{"amqp://u:hunter2@a:5672/v,amqp://u:hunter3@b:5672/v", "(another password)"},
		{"amqp://u:hunter2@a:5672/v,amqp://u:hunter2@b:5672/w", `(vhost "w", not "v")`},
		{"amqp://u:hunter2@a:5672/v,amqps://u:hunter2@b:5671/v", "(scheme amqps, not amqp)"},
	}
	for _, c := range bad {
		_, err := messaging.URLs(c.in)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("URLs(%q): error %v, want one saying %q", c.in, err, c.want)
			continue
		}
		if strings.Contains(err.Error(), "hunter") {
			t.Errorf("URLs(%q): error %q shows the password", c.in, err)
		}
	}
}

// Dial goes past an address where nothing answers to the next one, and
// successive dials start at successive addresses, so that a process's
// connections spread over the nodes and a reconnect tries another node
// first. Two proxies to the test broker stand for two nodes.
func TestDialTriesTheAddressesInTurn(t *testing.T) {
	t.Parallel()
	vhost := testenv.NewVhost(t)
	dead := strings.Replace(vhost, testenv.HostPort(vhost), testenv.FreeAddr(t), 1) // nothing listens there
	nodeA, nodeB := testenv.NewProxy(t, testenv.HostPort(vhost)), testenv.NewProxy(t, testenv.HostPort(vhost))
	list := strings.Join([]string{nodeA.Rewrite(vhost), dead, nodeB.Rewrite(vhost)}, ",")

	reached := map[string]int{}
	for range 6 {
		conn, err := messaging.Dial(t.Context(), list, "test")
		if err != nil {
			t.Fatalf("Dial with two of three addresses answering: %v", err)
		}
		reached[conn.RemoteAddr().String()]++
		_ = conn.Close()
	}
	if reached[nodeA.Addr()] == 0 || reached[nodeB.Addr()] == 0 || len(reached) != 2 {
		t.Errorf("six dials reached %v; want both %s and %s", reached, nodeA.Addr(), nodeB.Addr())
	}

	// With no address answering, the error names each one, and no password.
	nodeA.Cut()
	nodeB.Cut()
	_, err := messaging.Dial(t.Context(), list, "test")
	if err == nil {
		t.Fatal("Dial succeeded with no node answering")
	}
	for _, want := range []string{"no node of 3 answers", nodeA.Addr(), testenv.HostPort(dead), nodeB.Addr()} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "guest:guest") {
		t.Errorf("error %q shows a password", err)
	}
}

// Dial gives up when its context ends, even while an address does not
// answer at all.
func TestDialEndsWithItsContext(t *testing.T) {
	t.Parallel()
	vhost := testenv.NewVhost(t)
	stalled := testenv.NewProxy(t, testenv.HostPort(vhost))
	stalled.Stall() // the TCP connection opens; the handshake never gets an answer
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	started := time.Now()
	if _, err := messaging.Dial(ctx, stalled.Rewrite(vhost), "test"); err == nil {
		t.Fatal("Dial succeeded through a stalled proxy")
	}
	if took := time.Since(started); took > 5*time.Second {
		t.Errorf("Dial returned %s after its context ended", took)
	}
}
