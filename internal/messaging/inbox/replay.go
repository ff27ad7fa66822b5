package inbox

import (
	"context"
	"fmt"
	"time"

	"github.com/yourorg/orders/internal/messaging"
)

// Replay moves up to limit messages from the parking lot of consumer back
// to its work queue, oldest first, and says how many it moved. Each keeps
// its message_id (so the inbox still recognises it), loses the parking and
// retry headers (so it gets a fresh retry budget), and gains replayed_at.
// A message is removed from the parking lot only after the broker confirmed
// its copy in the work queue.
//
// What the consumer then does is the inbox's policy: a message PROCESSED
// before is acknowledged as a duplicate and changes nothing; one that
// failed is processed again. Replay is a production change: fix the cause
// first (docs/operations.md).
func Replay(ctx context.Context, amqpURL, consumer string, limit int) (int, error) {
	conn, err := messaging.Dial(ctx, amqpURL, "order-consumer replay "+consumer)
	if err != nil {
		return 0, err
	}
	defer func() { _ = conn.CloseDeadline(time.Now().Add(time.Second)) }()
	pub, err := newConfirmPublisher(conn)
	if err != nil {
		return 0, err
	}
	ch, err := conn.Channel()
	if err != nil {
		return 0, fmt.Errorf("open channel: %w", err)
	}
	queue := QueueName(consumer)
	parkingLot := ParkingLotName(queue)
	moved := 0
	for moved < limit {
		d, ok, err := ch.Get(parkingLot, false)
		if err != nil {
			return moved, fmt.Errorf("get from %s: %w", parkingLot, err)
		}
		if !ok {
			break
		}
		msg := republish(d)
		for _, h := range []string{HeaderParkedCode, HeaderParkedReason, HeaderParkedConsumer, HeaderParkedAttempts,
			HeaderParkedAt, HeaderParkedFromQueue, HeaderOriginalKey, HeaderRetryAttempt} {
			delete(msg.Headers, h)
		}
		msg.Headers[HeaderReplayedAt] = time.Now().UTC().Format(time.RFC3339Nano)
		if err := pub.publish(ctx, queue, msg); err != nil {
			_ = d.Nack(false, true)
			return moved, fmt.Errorf("replay %s: %w", d.MessageId, err)
		}
		if err := d.Ack(false); err != nil {
			return moved, fmt.Errorf("remove %s from %s: %w (it is in both queues now; the inbox absorbs the duplicate)", d.MessageId, parkingLot, err)
		}
		moved++
	}
	return moved, nil
}
