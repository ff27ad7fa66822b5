package messaging

import (
	"context"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/yourorg/orders/internal/domain"
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

// DeclareExchange declares the durable topic exchange every message goes
// through. Declaring is idempotent: each process does it at start and after
// every reconnect.
func DeclareExchange(ch *amqp.Channel) error {
	if err := ch.ExchangeDeclare(domain.EventsExchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare exchange %s: %w", domain.EventsExchange, err)
	}
	return nil
}
