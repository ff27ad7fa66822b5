package inbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/yourorg/orders/internal/domain"
	"github.com/yourorg/orders/internal/messaging"
)

// Delivery is a message as a handler sees it: the envelope, validated, and
// the payload, decoded (Message; the handler also gets it typed).
type Delivery struct {
	MessageID     string
	Type          string
	Version       int
	CorrelationID string
	CausationID   string
	TraceID       string // of the span processing the delivery
	Message       domain.Message
	// Attempt is this delivery's attempt (1 for the first, then one more
	// for each trip through a retry queue).
	Attempt     int
	Redelivered bool
	Body        []byte
	Headers     amqp.Table
}

// Cause is the cause of the changes the handler makes: this message, in
// the flow of its correlation id. The follow-up messages carry it as their
// causation_id and correlation_id.
func (d *Delivery) Cause() domain.Cause {
	return domain.Cause{MessageID: d.MessageID, CorrelationID: d.CorrelationID}
}

// OrderID is the order the message is about.
func (d *Delivery) OrderID() string {
	if d.Message == nil {
		return ""
	}
	return d.Message.OrderID().String()
}

// Outcome is what a handler did.
type Outcome struct {
	// Ignored, when set, says why the message changed nothing: the order
	// has moved past it, or its effect exists already. It is acknowledged
	// and its inbox row is PROCESSED with outcome IGNORED and this reason.
	Ignored string
	// Publish are follow-up messages. They are written to the outbox in the
	// same transaction, with causation_id = this message's id, the same
	// correlation id, and the trace context of this processing.
	Publish []domain.Message
	// External, when set, is a side effect outside the database: see
	// External.
	External *External
	// AfterCommit, when set, runs once the transaction has committed (and
	// before the ack): for what must only count a committed effect, such
	// as a business metric.
	AfterCommit func(ctx context.Context)
}

// Applied is the outcome of a handler that made its change.
func Applied(publish ...domain.Message) Outcome { return Outcome{Publish: publish} }

// Ignore is the outcome of a handler that changed nothing, and why.
func Ignore(reason string) Outcome { return Outcome{Ignored: reason} }

// External is a side effect no database transaction can cover (an HTTP
// call to another system), done in the two-step shape: the handler's
// transaction records the intent and commits with the inbox row still
// PROCESSING; Call runs outside any transaction; Record then stores the
// result in a second transaction, which marks the inbox row PROCESSED if
// Call succeeded. A failed Call is classified like any handler error. A
// worker that dies between the steps leaves the row PROCESSING; after the
// processing lease another delivery takes it over and calls again, so Call
// must be idempotent on the other side (an Idempotency-Key).
type External struct {
	Call   func(ctx context.Context) error
	Record func(ctx context.Context, tx pgx.Tx, callErr error) error
}

// AMQP headers the consumers read and write.
const (
	// HeaderRetryAttempt counts a message's trips through the retry queues.
	HeaderRetryAttempt = "retry_attempt"
	// Parking-lot headers: why a message is there.
	HeaderParkedCode      = "parked_reason_code"
	HeaderParkedReason    = "parked_reason"
	HeaderParkedConsumer  = "parked_consumer"
	HeaderParkedAttempts  = "parked_attempts"
	HeaderParkedAt        = "parked_at"
	HeaderParkedFromQueue = "parked_from_queue"
	HeaderOriginalKey     = "original_routing_key"
	// HeaderReplayedAt marks a message replayed from the parking lot;
	// HeaderReplayCount counts its replays, and HeaderReplayID names the
	// last replay that moved it (a replay leaves alone what it moved once).
	HeaderReplayedAt  = "replayed_at"
	HeaderReplayCount = "replay_count"
	HeaderReplayID    = "replay_id"
)

// parseDelivery validates the envelope of raw and decodes its payload. The
// Delivery is returned even on error, filled as far as it could be.
func parseDelivery(raw amqp.Delivery) (*Delivery, error) {
	d := &Delivery{
		MessageID:     raw.MessageId,
		Type:          raw.Type,
		CorrelationID: raw.CorrelationId,
		CausationID:   messaging.HeaderString(raw.Headers, messaging.HeaderCausationID),
		Attempt:       max(headerInt(raw.Headers, HeaderRetryAttempt), 1),
		Redelivered:   raw.Redelivered,
		Body:          raw.Body,
		Headers:       raw.Headers,
	}
	if d.MessageID == "" {
		return d, Permanent("missing_message_id", errors.New("the message has no message_id"))
	}
	if d.Type == "" {
		return d, Permanent("missing_type", errors.New("the message has no type"))
	}
	v, ok := raw.Headers[messaging.HeaderMessageVersion]
	if !ok {
		return d, Permanent("missing_version", errors.New("the message has no message_version header"))
	}
	if d.Version = toInt(v); d.Version < 1 {
		return d, Permanent("unsupported_version", fmt.Errorf("message_version %v is not a positive integer", v))
	}
	if raw.ContentType != "" && raw.ContentType != messaging.ContentTypeJSON {
		return d, Permanent("malformed_message", fmt.Errorf("content type %q, want %s", raw.ContentType, messaging.ContentTypeJSON))
	}
	msg, err := domain.DecodeMessage(d.Type, d.Version, raw.Body)
	if err != nil {
		return d, err // classified by Classify
	}
	d.Message = msg
	return d, nil
}

func (d *Delivery) inboxEntry(consumer string) Entry {
	sum := sha256.Sum256(d.Body)
	return Entry{
		Consumer: consumer, MessageID: d.MessageID, Type: d.Type, Version: d.Version,
		AggregateID: d.OrderID(), PayloadHash: hex.EncodeToString(sum[:]),
		CorrelationID: d.CorrelationID, CausationID: d.CausationID, TraceID: d.TraceID,
	}
}

func headerInt(h amqp.Table, key string) int { return toInt(h[key]) }

func toInt(v any) int {
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
