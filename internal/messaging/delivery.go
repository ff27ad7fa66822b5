package messaging

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
	"github.com/yourorg/orders/internal/store"
)

// Delivery is a message as a handler sees it: the envelope, validated, and
// the payload, decoded.
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

// OrderID is the order the message is about.
func (d *Delivery) OrderID() string {
	if d.Message == nil {
		return ""
	}
	return d.Message.OrderID().String()
}

// Handler applies one message of a consumer. It runs in the transaction
// that holds the message's inbox row, and knows nothing of
// acknowledgements: the consumer commits, acknowledges, retries or parks by
// what it returns. Errors are classified by Classify; wrap an error with
// Permanent when no retry can help.
type Handler interface {
	Handle(ctx context.Context, tx pgx.Tx, d *Delivery) (Outcome, error)
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, tx pgx.Tx, d *Delivery) (Outcome, error)

// Handle calls f.
func (f HandlerFunc) Handle(ctx context.Context, tx pgx.Tx, d *Delivery) (Outcome, error) {
	return f(ctx, tx, d)
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
	// HeaderReplayedAt marks a message replayed from the parking lot.
	HeaderReplayedAt = "replayed_at"
)

// failure is a classified processing error.
type failure struct {
	code      string
	permanent bool
	err       error
}

func (f *failure) Error() string { return f.code + ": " + f.err.Error() }
func (f *failure) Unwrap() error { return f.err }

// Permanent marks err as a failure no retry can fix, under a short code:
// the message is parked at once.
func Permanent(code string, err error) error { return &failure{code: code, permanent: true, err: err} }

// Transient marks err as a failure worth retrying later, under a code.
func Transient(code string, err error) error { return &failure{code: code, err: err} }

// Classify names a processing error and says whether a retry can help.
// Invalid messages and impossible transitions are permanent; database
// trouble (lock_timeout, statement_timeout, serialization_failure,
// deadlock, database_unavailable) and errors nobody classified are
// transient: retried with growing delays, then parked as poison.
func Classify(err error) (code string, permanent bool) {
	var f *failure
	switch {
	case errors.As(err, &f):
		return f.code, f.permanent
	case errors.Is(err, domain.ErrUnknownMessageType):
		return "unknown_type", true
	case errors.Is(err, domain.ErrUnsupportedVersion):
		return "unsupported_version", true
	case errors.Is(err, domain.ErrMalformedMessage):
		return "malformed_message", true
	case errors.Is(err, domain.ErrInvalidTransition):
		return "invalid_transition", true
	case errors.Is(err, domain.ErrNotFound):
		return "not_found", true
	case store.Transient(err):
		return store.TransientCode(err), false
	case errors.Is(err, domain.ErrConflict):
		return "conflict", false
	}
	return "handler_error", false
}

// parseDelivery validates the envelope of raw and decodes its payload. The
// Delivery is returned even on error, filled as far as it could be.
func parseDelivery(raw amqp.Delivery) (*Delivery, error) {
	d := &Delivery{
		MessageID:     raw.MessageId,
		Type:          raw.Type,
		CorrelationID: raw.CorrelationId,
		CausationID:   headerString(raw.Headers, HeaderCausationID),
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
	v, ok := raw.Headers[HeaderMessageVersion]
	if !ok {
		return d, Permanent("missing_version", errors.New("the message has no message_version header"))
	}
	if d.Version = toInt(v); d.Version < 1 {
		return d, Permanent("unsupported_version", fmt.Errorf("message_version %v is not a positive integer", v))
	}
	if raw.ContentType != "" && raw.ContentType != ContentTypeJSON {
		return d, Permanent("malformed_message", fmt.Errorf("content type %q, want %s", raw.ContentType, ContentTypeJSON))
	}
	msg, err := domain.DecodeMessage(d.Type, d.Version, raw.Body)
	if err != nil {
		return d, err // classified by Classify
	}
	d.Message = msg
	return d, nil
}

func (d *Delivery) inboxEntry(consumer string) store.InboxEntry {
	sum := sha256.Sum256(d.Body)
	return store.InboxEntry{
		Consumer: consumer, MessageID: d.MessageID, Type: d.Type, Version: d.Version,
		AggregateID: d.OrderID(), PayloadHash: hex.EncodeToString(sum[:]),
		CorrelationID: d.CorrelationID, CausationID: d.CausationID, TraceID: d.TraceID,
	}
}

func headerString(h amqp.Table, key string) string {
	s, _ := h[key].(string)
	return s
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
