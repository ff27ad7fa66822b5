package inboxadmin

import (
	"context"

	"github.com/yourorg/orders/internal/messaging/inbox/internal/resend"
)

// ReplayAs is Replay under the replay id id.
func ReplayAs(ctx context.Context, amqpURL, consumer string, r ReplayRequest, id string) ([]string, error) {
	lot, err := openParkingLot(ctx, amqpURL, consumer, "replay")
	if err != nil {
		return nil, err
	}
	defer lot.close()
	pub, err := resend.NewPublisher(lot.conn)
	if err != nil {
		return nil, err
	}
	return replay(ctx, lot, pub, consumer, r, id)
}

// The parking-lot and replay headers.
const (
	HeaderParkedCode        = resend.HeaderParkedCode
	HeaderParkedReason      = resend.HeaderParkedReason
	HeaderParkedAttempts    = resend.HeaderParkedAttempts
	HeaderParkedAggregateID = resend.HeaderParkedAggregateID
	HeaderParkedAt          = resend.HeaderParkedAt
	HeaderReplayedAt        = resend.HeaderReplayedAt
	HeaderReplayCount       = resend.HeaderReplayCount
	HeaderReplayID          = resend.HeaderReplayID
)
