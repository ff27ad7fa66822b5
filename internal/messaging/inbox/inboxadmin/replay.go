package inboxadmin

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/yourorg/orders/internal/messaging"
	"github.com/yourorg/orders/internal/messaging/inbox"
	"github.com/yourorg/orders/internal/messaging/inbox/internal/resend"
)

// ReplayRequest says which parked messages Replay moves.
type ReplayRequest struct {
	// MessageID, when set, replays only that message; the others stay where
	// they are.
	MessageID string
	// Limit caps how many messages are moved (0: every one that was in the
	// parking lot when the replay started).
	Limit int
}

// Replay moves messages from the parking lot of consumer back to the work
// queue they came from (with partitions, their partition's), oldest first, and returns the ids of those it moved. Each keeps
// its message_id (so the inbox still recognises it), loses the parking and
// retry headers (so it gets a fresh retry budget), and gains replayed_at,
// replay_count (one more than it had) and replay_id (this replay's). A
// message is removed from the parking lot only after the broker confirmed
// its copy in the work queue.
//
// A replay never takes a message twice, so it cannot loop on one that fails
// again: it looks at no more messages than were parked when it started (a
// message parked again lands behind those), and leaves alone any that
// carries its own replay_id.
//
// What the consumer then does is the inbox's policy: a message PROCESSED
// before is acknowledged as a duplicate and changes nothing; one that
// failed is processed again. Replay is a production change: fix the cause
// first (docs/operations.md).
func Replay(ctx context.Context, amqpURL, consumer string, r ReplayRequest) ([]string, error) {
	lot, err := openParkingLot(ctx, amqpURL, consumer, "replay")
	if err != nil {
		return nil, err
	}
	defer lot.close()
	pub, err := resend.NewPublisher(lot.conn)
	if err != nil {
		return nil, err
	}
	return replay(ctx, lot, pub, r, uuid.NewString())
}

// replay is Replay with the replay's id given (tests).
func replay(ctx context.Context, lot *parkingLot, pub *resend.Publisher, r ReplayRequest, id string) ([]string, error) {
	var moved []string
	err := lot.scan(0, func(d amqp.Delivery) (bool, bool, error) {
		switch {
		case ctx.Err() != nil:
			return false, true, ctx.Err()
		case r.MessageID != "" && d.MessageId != r.MessageID,
			messaging.HeaderString(d.Headers, resend.HeaderReplayID) == id: // replayed by this run, and parked again
			return false, false, nil
		}
		msg := resend.Copy(d)
		for _, h := range []string{resend.HeaderParkedCode, resend.HeaderParkedReason, resend.HeaderParkedConsumer, resend.HeaderParkedAttempts,
			resend.HeaderParkedAt, resend.HeaderParkedFromQueue, resend.HeaderOriginalKey, inbox.HeaderRetryAttempt} {
			delete(msg.Headers, h)
		}
		msg.Headers[resend.HeaderReplayedAt] = time.Now().UTC().Format(time.RFC3339Nano)
		msg.Headers[resend.HeaderReplayCount] = int32(resend.Int(d.Headers, resend.HeaderReplayCount) + 1)
		msg.Headers[resend.HeaderReplayID] = id
		if err := pub.Publish(ctx, replayQueue(d, lot.queue), msg); err != nil {
			return false, true, fmt.Errorf("replay %s: %w", d.MessageId, err)
		}
		if err := d.Ack(false); err != nil {
			return false, true, fmt.Errorf("remove %s from %s: %w (it is in both queues now; the inbox absorbs the duplicate)", d.MessageId, lot.name, err)
		}
		moved = append(moved, d.MessageId)
		return true, r.Limit > 0 && len(moved) >= r.Limit, nil
	})
	return moved, err
}

// replayQueue is the work queue a parked message goes back to: the one it
// was parked from, as the consumer's parked_from_queue header or the
// broker's x-death says; else the consumer's work queue.
func replayQueue(d amqp.Delivery, workQueue string) string {
	if q := messaging.HeaderString(d.Headers, resend.HeaderParkedFromQueue); q != "" {
		return q
	}
	if deaths, ok := d.Headers["x-death"].([]any); ok {
		for _, death := range deaths {
			if t, ok := death.(amqp.Table); ok && messaging.HeaderString(t, "queue") != "" {
				return messaging.HeaderString(t, "queue")
			}
		}
	}
	return workQueue
}
