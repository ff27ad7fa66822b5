// Package resend is what the consumers and the parking-lot tools share to
// send a delivery on somewhere else: to a retry queue, to a parking lot,
// or from a parking lot back to its work queue. A copy keeps the
// message's id, properties and body (Copy); a publisher sends it and
// reports success only once the broker confirmed it (Publisher); the
// headers say why it travelled.
package resend

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Copy copies a delivery into a new publishing: the same message id,
// properties, headers and body.
func Copy(raw amqp.Delivery) amqp.Publishing {
	headers := amqp.Table{}
	for k, v := range raw.Headers {
		// The broker's own bookkeeping of the earlier trips stays behind.
		if k != "x-death" && k != "x-delivery-count" && !strings.HasPrefix(k, "x-first-death-") {
			headers[k] = v
		}
	}
	return amqp.Publishing{
		Headers: headers, ContentType: raw.ContentType, ContentEncoding: raw.ContentEncoding,
		DeliveryMode: amqp.Persistent, Priority: raw.Priority, CorrelationId: raw.CorrelationId,
		ReplyTo: raw.ReplyTo, Expiration: raw.Expiration, MessageId: raw.MessageId, Timestamp: raw.Timestamp,
		Type: raw.Type, UserId: raw.UserId, AppId: raw.AppId, Body: raw.Body,
	}
}

// Publisher publishes the consumers' retries and parkings, one at a
// time, and reports success only once the broker confirmed the message and
// did not return it. These are rare, so one at a time is plenty. A channel
// the broker closed (a publish it refused, say) is noticed and replaced on
// the next publish; a dead connection ends the consumer's session anyway.
type Publisher struct {
	conn    *amqp.Connection
	mu      sync.Mutex
	ch      *amqp.Channel
	returns chan amqp.Return
}

// NewPublisher opens a publisher on conn.
func NewPublisher(conn *amqp.Connection) (*Publisher, error) {
	p := &Publisher{conn: conn}
	if err := p.open(); err != nil {
		return nil, err
	}
	return p, nil
}

// open opens the publisher's channel, in confirm mode.
func (p *Publisher) open() error {
	ch, err := p.conn.Channel()
	if err != nil {
		return fmt.Errorf("open publisher channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		_ = ch.Close()
		return fmt.Errorf("confirm mode: %w", err)
	}
	p.ch, p.returns = ch, ch.NotifyReturn(make(chan amqp.Return, 16))
	return nil
}

// Publish sends msg to queue through the default exchange.
func (p *Publisher) Publish(ctx context.Context, queue string, msg amqp.Publishing) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ch.IsClosed() {
		if err := p.open(); err != nil {
			return fmt.Errorf("the publisher channel closed, and reopening it failed: %w", err)
		}
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	dc, err := p.ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, msg)
	if err != nil {
		return err
	}
	acked, err := dc.WaitContext(ctx)
	if err != nil {
		return fmt.Errorf("no confirm: %w", err)
	}
returns: // a return comes before the ack of the same message
	for {
		select {
		case ret, ok := <-p.returns:
			if !ok {
				break returns // the channel closed: no return is coming
			}
			if ret.MessageId != msg.MessageId {
				continue // a late return of an earlier publish that timed out
			}
			return fmt.Errorf("returned: %d %s (queue %s missing?)", ret.ReplyCode, ret.ReplyText, queue)
		default:
			break returns
		}
	}
	switch {
	case acked:
		return nil
	case p.ch.IsClosed():
		return errors.New("the channel closed before the broker confirmed")
	default:
		return errors.New("nacked by RabbitMQ")
	}
}

// Interrupt closes the publisher's channel, as the broker does when it
// refuses a publish; the next Publish opens a new one (tests).
func (p *Publisher) Interrupt() {
	p.mu.Lock()
	defer p.mu.Unlock()
	_ = p.ch.Close()
}
