package resend

import (
	"strconv"

	amqp "github.com/rabbitmq/amqp091-go"
)

// The AMQP headers a message gains on its trips into a parking lot and
// back by a replay (a retry's is inbox.HeaderRetryAttempt).
const (
	HeaderParkedCode        = "parked_reason_code"
	HeaderParkedReason      = "parked_reason"
	HeaderParkedConsumer    = "parked_consumer"
	HeaderParkedAttempts    = "parked_attempts"
	HeaderParkedAt          = "parked_at"
	HeaderParkedFromQueue   = "parked_from_queue"
	HeaderParkedAggregateID = "parked_aggregate_id"
	HeaderOriginalKey       = "original_routing_key"

	HeaderReplayedAt  = "replayed_at"
	HeaderReplayCount = "replay_count"
	HeaderReplayID    = "replay_id"
)

// Int reads header key of h as an integer, whichever integer type (or
// decimal string) the sender wrote it as; 0 when it is missing or not one.
func Int(h amqp.Table, key string) int { return ToInt(h[key]) }

// ToInt is Int for a value already taken out of its table.
func ToInt(v any) int {
	switch n := v.(type) {
	case int:
		return n
	case int8:
		return int(n)
	case int16:
		return int(n)
	case int32:
		return int(n)
	case int64:
		return int(n)
	case uint8:
		return int(n)
	case uint16:
		return int(n)
	case uint32:
		return int(n)
	case string:
		i, _ := strconv.Atoi(n)
		return i
	}
	return 0
}
