package messaging

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// A broker address (AMQP_URL) is one amqp:// or amqps:// URL, or several
// separated by commas: the nodes of one RabbitMQ cluster, each written
// out in full,
//
//	amqp://orders-relay:secret@rabbitmq-1:5672/,amqp://orders-relay:secret@rabbitmq-2:5672/,amqp://orders-relay:secret@rabbitmq-3:5672/
//
// They must agree on everything but the host and port (the user, the
// password, the vhost, the scheme): a cluster has one set of users and
// vhosts, so a difference is a mistake. Dial connects to one of them.

// dialTimeout bounds the TCP connection and the AMQP handshake to one
// address, so that a node that does not answer (a dead host, a cut
// network) holds up the next address at most this long.
const dialTimeout = 10 * time.Second

// nextAddress rotates the address each Dial starts at. It starts at a
// random number, so that the processes of a deployment spread over the
// nodes, and each Dial of a process (its consumers, a reconnect) starts
// one further along: a process whose node died tries another one first.
var nextAddress atomic.Uint32

func init() { nextAddress.Store(rand.Uint32()) }

// URLs splits a broker address (AMQP_URL) into its URLs, and checks that
// each is an AMQP URL and that they differ only in host and port. Its
// errors never carry a password.
func URLs(amqpURL string) ([]string, error) {
	if strings.TrimSpace(amqpURL) == "" {
		return nil, errors.New("no URL: want amqp://user:password@host:5672/vhost, or several separated by commas (the nodes of a cluster)")
	}
	parts := strings.Split(amqpURL, ",")
	urls := make([]string, len(parts))
	var first amqp.URI
	for i, part := range parts {
		part = strings.TrimSpace(part)
		if part == "" {
			return nil, fmt.Errorf("URL %d of %d is empty (a comma too many?)", i+1, len(parts))
		}
		uri, err := amqp.ParseURI(part)
		if err != nil {
			return nil, fmt.Errorf("URL %d of %d: want amqp://user:password@host:5672/vhost: %w", i+1, len(parts), redactErr(err, part))
		}
		if i == 0 {
			first = uri
		} else {
			var diff []string
			if uri.Scheme != first.Scheme {
				diff = append(diff, fmt.Sprintf("scheme %s, not %s", uri.Scheme, first.Scheme))
			}
			if uri.Username != first.Username {
				diff = append(diff, fmt.Sprintf("user %q, not %q", uri.Username, first.Username))
			}
			if uri.Password != first.Password {
				diff = append(diff, "another password")
			}
			if vhost(uri) != vhost(first) {
				diff = append(diff, fmt.Sprintf("vhost %q, not %q", vhost(uri), vhost(first)))
			}
			if len(diff) > 0 {
				return nil, fmt.Errorf("URL %d of %d differs from the first in more than host and port (%s): list the nodes of one cluster, logged in the same way",
					i+1, len(parts), strings.Join(diff, ", "))
			}
		}
		urls[i] = part
	}
	return urls, nil
}

// vhost is the vhost a URL names: "/" for none (amqp://host and
// amqp://host/ both mean the default vhost).
func vhost(uri amqp.URI) string {
	if uri.Vhost == "" {
		return "/"
	}
	return uri.Vhost
}

// CheckURL checks a broker address as URLs does (a process's
// configuration: config.Named("AMQP_URL", messaging.CheckURL(url))).
func CheckURL(amqpURL string) error {
	_, err := URLs(amqpURL)
	return err
}

// redactErr removes the password of rawURL from an error of the URL
// parser, which may quote the URL.
func redactErr(err error, rawURL string) error {
	uri, perr := amqp.ParseURI(rawURL)
	msg := err.Error()
	if perr == nil && uri.Password != "" {
		msg = strings.ReplaceAll(msg, uri.Password, "*****")
	} else if _, rest, ok := strings.Cut(rawURL, "://"); ok {
		if userinfo, _, ok := strings.Cut(rest, "@"); ok {
			if _, password, ok := strings.Cut(userinfo, ":"); ok && password != "" {
				msg = strings.ReplaceAll(msg, password, "*****")
			}
		}
	}
	return errors.New(msg)
}

// Dial opens an AMQP connection named name (shown in the management UI's
// connection list) to the broker of amqpURL (URLs: one address, or the
// nodes of a cluster), giving up when ctx ends. With several addresses it
// tries them in turn, each for at most 10 seconds, starting at the one
// after the address the previous Dial of this process started at, and
// returns the first connection that opens; it fails only when none does.
// The node it reached is conn.RemoteAddr().
func Dial(ctx context.Context, amqpURL, name string) (*amqp.Connection, error) {
	urls, err := URLs(amqpURL)
	if err != nil {
		return nil, fmt.Errorf("connect to RabbitMQ: AMQP_URL: %w", err)
	}
	start := int(nextAddress.Add(1) % uint32(len(urls)))
	var errs []error
	for i := range urls {
		u := urls[(start+i)%len(urls)]
		conn, err := dialOne(ctx, u, name)
		if err == nil {
			return conn, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if len(urls) == 1 {
			return nil, fmt.Errorf("connect to RabbitMQ: %w", err)
		}
		errs = append(errs, fmt.Errorf("%s: %w", hostPort(u), err))
	}
	return nil, fmt.Errorf("connect to RabbitMQ: no node of %d answers: %w", len(urls), errors.Join(errs...))
}

func dialOne(ctx context.Context, url, name string) (*amqp.Connection, error) {
	cfg := amqp.Config{
		Heartbeat: 10 * time.Second,
		Locale:    "en_US",
		Dial:      amqp.DefaultDial(dialTimeout),
		Properties: amqp.Table{
			"connection_name": name,
			"product":         "github.com/yourorg/orders",
		},
	}
	type result struct {
		conn *amqp.Connection
		err  error
	}
	done := make(chan result, 1)
	go func() {
		conn, err := amqp.DialConfig(url, cfg)
		done <- result{conn, err}
	}()
	select {
	case r := <-done:
		return r.conn, r.err
	case <-ctx.Done():
		go func() {
			if r := <-done; r.conn != nil {
				_ = r.conn.Close()
			}
		}()
		return nil, ctx.Err()
	}
}

// hostPort is the host and port of an AMQP URL that URLs accepted.
func hostPort(rawURL string) string {
	uri, err := amqp.ParseURI(rawURL)
	if err != nil {
		return "?"
	}
	return net.JoinHostPort(uri.Host, strconv.Itoa(uri.Port))
}

// Open dials the broker as Dial does and opens a channel on the
// connection. Close the connection when done; it closes the channel.
func Open(ctx context.Context, url, name string) (*amqp.Connection, *amqp.Channel, error) {
	conn, err := Dial(ctx, url, name)
	if err != nil {
		return nil, nil, err
	}
	ch, err := conn.Channel()
	if err != nil {
		_ = conn.Close()
		return nil, nil, fmt.Errorf("open channel: %w", err)
	}
	return conn, ch, nil
}

// DeclareExchange declares a durable topic exchange named name. Declaring
// is idempotent: each process does it at start and after every reconnect.
func DeclareExchange(ch *amqp.Channel, name string) error {
	if err := ch.ExchangeDeclare(name, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare exchange %s: %w", name, err)
	}
	return nil
}
