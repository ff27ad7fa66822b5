package inboxadmin

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/yourorg/orders/internal/database"
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
	// Window is the inbox's replay window (CONSUMER_REPLAY_WINDOW): the
	// inbox keeps a message's row at least that long after its first
	// delivery, no longer for sure. A message first delivered longer ago
	// is not moved, since its row may be gone and the consumer would apply
	// it again: Replay leaves it in the parking lot and returns a
	// *PastWindowError naming it. 0: no window (every message is moved).
	Window time.Duration
	// DB is where the consumer's inbox rows are (the first delivery of a
	// message); required with Window.
	DB database.DBTX
	// PastWindow moves the messages past Window too: the operator accepts
	// that one whose inbox row is gone may be applied twice.
	PastWindow bool
}

// PastWindowError says which parked messages a replay left in the parking
// lot because they were first delivered longer ago than the replay window.
type PastWindowError struct {
	Window time.Duration
	IDs    []string // their message ids
}

func (e *PastWindowError) Error() string {
	return fmt.Sprintf("not replayed: %d message(s) first delivered more than the replay window (CONSUMER_REPLAY_WINDOW, %s) ago, %v: "+
		"their inbox rows may be gone, and a replay could apply them twice; they stay parked (replay them anyway with --past-window, "+
		"once sure that applying one twice does no harm)", len(e.IDs), e.Window, e.IDs)
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
	if r.Window > 0 && !r.PastWindow && r.DB == nil {
		return nil, errors.New("replay: a replay window needs the inbox's database")
	}
	lot, err := openParkingLot(ctx, amqpURL, consumer, "replay")
	if err != nil {
		return nil, err
	}
	defer lot.close()
	pub, err := resend.NewPublisher(lot.conn)
	if err != nil {
		return nil, err
	}
	return replay(ctx, lot, pub, consumer, r, uuid.NewString())
}

// replay is Replay with the replay's id given (tests).
func replay(ctx context.Context, lot *parkingLot, pub *resend.Publisher, consumer string, r ReplayRequest, id string) ([]string, error) {
	var (
		moved []string
		past  *PastWindowError
	)
	err := lot.scan(0, func(d amqp.Delivery) (bool, bool, error) {
		switch {
		case ctx.Err() != nil:
			return false, true, ctx.Err()
		case r.MessageID != "" && d.MessageId != r.MessageID,
			messaging.HeaderString(d.Headers, resend.HeaderReplayID) == id: // replayed by this run, and parked again
			return false, false, nil
		}
		if r.Window > 0 && !r.PastWindow {
			first, err := firstDelivery(ctx, r.DB, consumer, d)
			if err != nil {
				return false, true, fmt.Errorf("replay %s: %w", d.MessageId, err)
			}
			if !first.IsZero() && time.Since(first) > r.Window {
				if past == nil {
					past = &PastWindowError{Window: r.Window}
				}
				past.IDs = append(past.IDs, d.MessageId)
				return false, r.MessageID != "", nil
			}
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
	if err == nil && past != nil {
		err = past
	}
	return moved, err
}

// firstDelivery is the earliest a parked message is known to have been
// delivered to consumer: its inbox row's first_received_at, or when no
// row is left, when it was parked (parked_at, or the broker's x-death
// time), which came after its first delivery. Zero when none says.
func firstDelivery(ctx context.Context, db database.DBTX, consumer string, d amqp.Delivery) (time.Time, error) {
	var first time.Time
	earlier := func(t time.Time) {
		if !t.IsZero() && (first.IsZero() || t.Before(first)) {
			first = t
		}
	}
	row, err := Get(ctx, db, consumer, d.MessageId)
	switch {
	case err == nil:
		earlier(row.FirstReceivedAt)
	case !errors.Is(err, database.ErrNotFound):
		return time.Time{}, err
	}
	if at, err := time.Parse(time.RFC3339Nano, messaging.HeaderString(d.Headers, resend.HeaderParkedAt)); err == nil {
		earlier(at)
	}
	if deaths, ok := d.Headers["x-death"].([]any); ok {
		for _, death := range deaths {
			if t, ok := death.(amqp.Table); ok {
				if at, ok := t["time"].(time.Time); ok {
					earlier(at)
				}
			}
		}
	}
	return first, nil
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
