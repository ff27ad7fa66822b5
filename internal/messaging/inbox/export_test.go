package inbox

import (
	"context"
	"time"

	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/messaging/inbox/internal/resend"
)

// AfterCommit is a Faults whose AfterCommit calls the function.
type AfterCommit func(*Delivery)

func (f AfterCommit) AfterCommit(_ context.Context, d *Delivery) { f(d) }

// KillPublisherChannels closes the channel each consumer publishes its
// retries and parkings on, as the broker does when it refuses a publish.
func KillPublisherChannels(cs *Consumers) {
	for _, s := range cs.subscriptions {
		if p := s.pub.Load(); p != nil {
			p.Interrupt()
		}
	}
}

// The inbox's row operations, for the tests that drive a row through its
// states without a broker.
type (
	Entry    = entry
	Decision = decision
	Failure  = failedAttempt
)

var (
	MarkProcessed = markProcessed
	Hold          = hold
	Fence         = fence
	RecordFailure = recordFailure
	ErrProcessed  = errProcessed
	ErrTakenOver  = errTakenOver
)

// Begin records the delivery of e in tx, as a worker does for a batch of
// one: insert its row, or decide on the row it found.
func Begin(ctx context.Context, tx database.DBTX, e Entry, lease time.Duration) (Decision, error) {
	inserted, err := insertRows(ctx, tx, e.Consumer, []entry{e}, false)
	if err != nil {
		return decision{}, err
	}
	if inserted[0].Inserted {
		return decision{Process: true, Attempt: 1}, nil
	}
	return beginSeen(ctx, tx, e, lease)
}

// The parking-lot and replay headers.
const (
	HeaderParkedCode        = resend.HeaderParkedCode
	HeaderParkedReason      = resend.HeaderParkedReason
	HeaderParkedConsumer    = resend.HeaderParkedConsumer
	HeaderParkedAttempts    = resend.HeaderParkedAttempts
	HeaderParkedAt          = resend.HeaderParkedAt
	HeaderParkedFromQueue   = resend.HeaderParkedFromQueue
	HeaderParkedAggregateID = resend.HeaderParkedAggregateID
	HeaderOriginalKey       = resend.HeaderOriginalKey
	HeaderReplayedAt        = resend.HeaderReplayedAt
	HeaderReplayCount       = resend.HeaderReplayCount
	HeaderReplayID          = resend.HeaderReplayID
)
