package inboxadmin

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/yourorg/orders/internal/messaging"
	"github.com/yourorg/orders/internal/messaging/inbox"
	"github.com/yourorg/orders/internal/messaging/inbox/internal/resend"
)

// The operator's side of the parking lots (cmd/orderctl): look at parked
// messages without taking them out (Browse), replay them (Replay, in
// replay.go) or discard one for good (Discard). The consumers park a
// message with headers that say why (package inbox, failure.go); these
// read them.

// Parked is a message in a consumer's parking lot.
type Parked struct {
	MessageID   string     `json:"message_id"`
	Type        string     `json:"type"`
	AggregateID string     `json:"aggregate_id,omitempty"` // parked_aggregate_id: what the message is about, when its payload was read
	ReasonCode  string     `json:"reason_code"`            // parked_reason_code, or delivery_limit (ParkedReason)
	Reason      string     `json:"reason"`                 // parked_reason, or what the broker's x-death says
	Attempts    int        `json:"attempts"`               // parked_attempts
	ParkedAt    string     `json:"parked_at"`              // parked_at, RFC 3339
	ReplayCount int        `json:"replay_count"`           // how often it was replayed before
	PayloadHash string     `json:"payload_hash"`           // SHA-256 of the body, as the inbox row keeps it
	Headers     amqp.Table `json:"headers"`
	Body        []byte     `json:"-"`
}

func parkedMessage(d amqp.Delivery) Parked {
	sum := sha256.Sum256(d.Body)
	code, reason := ParkedReason(d.Headers)
	return Parked{
		MessageID: d.MessageId, Type: d.Type, AggregateID: messaging.HeaderString(d.Headers, resend.HeaderParkedAggregateID), ReasonCode: code, Reason: reason,
		Attempts: resend.Int(d.Headers, resend.HeaderParkedAttempts), ParkedAt: messaging.HeaderString(d.Headers, resend.HeaderParkedAt),
		ReplayCount: resend.Int(d.Headers, resend.HeaderReplayCount), PayloadHash: hex.EncodeToString(sum[:]),
		Headers: d.Headers, Body: d.Body,
	}
}

// parkingLot is a connection to the parking lot of one consumer.
type parkingLot struct {
	conn  *amqp.Connection
	ch    *amqp.Channel
	queue string // the consumer's work queue
	name  string // its parking lot
}

func openParkingLot(ctx context.Context, amqpURL, consumer, purpose string) (*parkingLot, error) {
	conn, err := messaging.Dial(ctx, amqpURL, purpose+" "+consumer)
	if err != nil {
		return nil, err
	}
	ch, err := conn.Channel()
	if err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("open channel: %w", err)
	}
	queue := inbox.QueueName(consumer)
	return &parkingLot{conn: conn, ch: ch, queue: queue, name: inbox.ParkingLotName(queue)}, nil
}

// close closes the connection; the broker takes back any message still
// unacknowledged, as scan's nack would have.
func (p *parkingLot) close() { _ = p.conn.CloseDeadline(time.Now().Add(time.Second)) }

// scan takes the messages that are in the parking lot when it starts (at
// most limit; 0: no limit), oldest first, and shows each to visit, which may
// settle it (ack it away) and may stop the scan. The messages scan does not
// settle are given back at the end, all at once.
//
// Looking is basic.get without an ack, then one basic.nack with requeue for
// everything taken. A basic.get per message rather than a consumer with a
// prefetch: the count is exact (a consumer's prefetch would hand over
// messages past the ones it wants, to be returned too), and an operator's
// scan of a parking lot needs no throughput. It neither reorders nor loses
// anything: an unacknowledged message still belongs to the broker (if this
// process dies, its connection closes and the broker requeues them all),
// and RabbitMQ puts requeued messages back where they were (a quorum queue
// serves them again first, in their order) while nothing else consumes
// the parking lot. Bounding the scan by the depth at its start keeps out the
// messages parked meanwhile: a replayed message that fails again is parked
// behind them, so a replay can never loop on it.
//
// A return counts in a quorum queue message's delivery count. RabbitMQ 3.x
// sets no delivery limit on a queue that declares none (as the parking lots
// do), so looking never drops a message there. RabbitMQ 4.0 to 4.2 default
// to a limit of 20 and count every return: there, give the parking lots an
// unlimited delivery limit (a policy) first.
func (p *parkingLot) scan(limit int, visit func(d amqp.Delivery) (settled, stop bool, err error)) (err error) {
	q, err := p.ch.QueueDeclarePassive(p.name, true, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("parking lot %s: %w", p.name, err)
	}
	n := q.Messages
	if limit > 0 {
		n = min(n, limit)
	}
	var (
		last    uint64 // the last message taken and not settled
		settled int
	)
	defer func() {
		if last == 0 {
			return
		}
		if nerr := p.ch.Nack(last, true, true); nerr != nil {
			if err == nil {
				// The connection closes next, and the broker requeues them anyway.
				err = fmt.Errorf("give back the messages of %s: %w", p.name, nerr)
			}
			return
		}
		p.awaitDepth(q.Messages - settled)
	}()
	for range n {
		d, ok, err := p.ch.Get(p.name, false)
		if err != nil {
			return fmt.Errorf("get from %s: %w", p.name, err)
		}
		if !ok {
			return nil
		}
		done, stop, err := visit(d)
		if done {
			settled++
		} else {
			last = d.DeliveryTag
		}
		if err != nil || stop {
			return err
		}
	}
	return nil
}

// awaitDepth waits (a few seconds at most) until the parking lot holds at
// least want messages again. A nack has no reply, and a quorum queue takes
// the returned messages back through its log after the nack has gone: a
// scan that returned at once would let the next command (a replay straight
// after a list, in a script) find the parking lot short. Messages parked
// meanwhile only make the depth reach want sooner, never later.
func (p *parkingLot) awaitDepth(want int) {
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		q, err := p.ch.QueueDeclarePassive(p.name, true, false, false, false, nil)
		if err != nil || q.Messages >= want {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Browse returns up to limit messages of consumer's parking lot (0: all),
// oldest first, and leaves them there in the same order.
func Browse(ctx context.Context, amqpURL, consumer string, limit int) ([]Parked, error) {
	lot, err := openParkingLot(ctx, amqpURL, consumer, "browse")
	if err != nil {
		return nil, err
	}
	defer lot.close()
	var out []Parked
	err = lot.scan(limit, func(d amqp.Delivery) (bool, bool, error) {
		out = append(out, parkedMessage(d))
		return false, ctx.Err() != nil, ctx.Err()
	})
	return out, err
}

// ErrNotParked says that a message is not in the parking lot.
var ErrNotParked = errors.New("not in the parking lot")

// Discard takes message messageID out of consumer's parking lot for good
// (every copy of it, if it was parked more than once). record runs first,
// with the message as it is: only if it succeeds is the message
// acknowledged away, so that no discard goes unrecorded. The message's
// inbox row, if any, stays as it is. A message that is not there is
// ErrNotParked.
func Discard(ctx context.Context, amqpURL, consumer, messageID string, record func(Parked) error) (Parked, error) {
	lot, err := openParkingLot(ctx, amqpURL, consumer, "discard")
	if err != nil {
		return Parked{}, err
	}
	defer lot.close()
	var found []Parked
	err = lot.scan(0, func(d amqp.Delivery) (bool, bool, error) {
		if d.MessageId != messageID {
			return false, false, ctx.Err()
		}
		p := parkedMessage(d)
		if err := record(p); err != nil {
			return false, true, err
		}
		if err := d.Ack(false); err != nil {
			return false, true, fmt.Errorf("discard %s from %s: %w", messageID, lot.name, err)
		}
		found = append(found, p)
		return true, false, nil
	})
	if err != nil {
		return Parked{}, err
	}
	if len(found) == 0 {
		return Parked{}, fmt.Errorf("%w: no message %s in %s", ErrNotParked, messageID, lot.name)
	}
	return found[0], nil
}

// ParkedReason says why a message is in a parking lot: the parked_reason_code
// and parked_reason headers the consumer wrote when it parked it; or, for a
// message the broker dead-lettered on its own (the work queue's
// x-delivery-limit: a consumer crashed on it again and again, or could never
// settle it), "delivery_limit" and what that means. Such a message has no
// inbox row that says why; replaying it is safe like any other.
func ParkedReason(h amqp.Table) (code, reason string) {
	if code := messaging.HeaderString(h, resend.HeaderParkedCode); code != "" {
		return code, messaging.HeaderString(h, resend.HeaderParkedReason)
	}
	if deaths, ok := h["x-death"].([]any); ok {
		for _, d := range deaths {
			death, ok := d.(amqp.Table)
			if !ok {
				continue
			}
			if why := messaging.HeaderString(death, "reason"); why == "delivery_limit" {
				return "delivery_limit", fmt.Sprintf("redelivered more than the delivery limit of %s (CONSUMER_DELIVERY_LIMIT): "+
					"a consumer crashed on it, or could not settle it, each time", messaging.HeaderString(death, "queue"))
			} else if why != "" {
				return "dead_lettered", fmt.Sprintf("dead-lettered by the broker from %s (%s)", messaging.HeaderString(death, "queue"), why)
			}
		}
	}
	return "unknown", "no parking headers: not parked by this service"
}
