package messaging

import (
	"context"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Dial opens an AMQP connection named name (shown in the management UI's
// connection list), giving up when ctx ends.
func Dial(ctx context.Context, url, name string) (*amqp.Connection, error) {
	cfg := amqp.Config{
		Heartbeat: 10 * time.Second,
		Locale:    "en_US",
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
		if r.err != nil {
			return nil, fmt.Errorf("connect to RabbitMQ: %w", r.err)
		}
		return r.conn, nil
	case <-ctx.Done():
		go func() {
			if r := <-done; r.conn != nil {
				_ = r.conn.Close()
			}
		}()
		return nil, ctx.Err()
	}
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
