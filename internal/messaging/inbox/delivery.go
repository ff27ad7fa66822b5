package inbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/yourorg/orders/internal/messaging"
	"github.com/yourorg/orders/internal/messaging/inbox/internal/resend"
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
	// Message is the payload, decoded into the type of its handler.
	Message messaging.Message
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
func (d *Delivery) Cause() messaging.Cause {
	return messaging.Cause{MessageID: d.MessageID, CorrelationID: d.CorrelationID}
}

// AggregateID is the entity the message is about, once its payload is
// decoded; "" before.
func (d *Delivery) AggregateID() string {
	if d.Message == nil {
		return ""
	}
	return d.Message.AggregateID()
}

// Outcome is what a handler did.
type Outcome struct {
	// Ignored, when set, says why the message changed nothing: the order
	// has moved past it, or its effect exists already. It is acknowledged
	// and its inbox row is PROCESSED with outcome IGNORED and this reason.
	Ignored string
	// Publish are follow-up messages. They are written to the outbox in the
	// same transaction, with causation_id = this message's id, the same
	// correlation id, and the trace context of this processing. With
	// External, they are written with its second step, once the call
	// succeeded (see External).
	Publish []messaging.Message
	// External, when set, is a side effect outside the database: see
	// External.
	External *External
	// AfterCommit, when set, runs once the transaction has committed (and
	// before the ack): for what must only count a committed effect, such
	// as a business metric.
	AfterCommit func(ctx context.Context)
}

// Applied is the outcome of a handler that made its change.
func Applied(publish ...messaging.Message) Outcome { return Outcome{Publish: publish} }

// Ignore is the outcome of a handler that changed nothing, and why.
func Ignore(reason string) Outcome { return Outcome{Ignored: reason} }

// HeaderRetryAttempt counts a message's trips through the retry queues.
const HeaderRetryAttempt = "retry_attempt"

// Header is an AMQP header the consumers write on a message they retry,
// park or replay: its name, its JSON schema type (integer, string or
// date-time) and what it says.
type Header struct{ Name, Type, Description string }

// Headers lists the headers the consumers write, in the order a message
// meets them: the AsyncAPI document (api/) and the parking-lot tools read
// them from here.
var Headers = []Header{
	{HeaderRetryAttempt, "integer", "On a retry: the attempt this delivery is (2 for the first retry)."},
	{resend.HeaderParkedCode, "string", "In a parking lot: why, as a short code (schema_violation, malformed_message, unsupported_version, handler_error, ...)."},
	{resend.HeaderParkedReason, "string", "In a parking lot: why, in words (the error)."},
	{resend.HeaderParkedConsumer, "string", "In a parking lot: the consumer that parked it."},
	{resend.HeaderParkedAttempts, "integer", "In a parking lot: the attempts made."},
	{resend.HeaderParkedAt, "date-time", "In a parking lot: when it was parked."},
	{resend.HeaderParkedFromQueue, "string", "In a parking lot: the work queue it came from."},
	{resend.HeaderParkedAggregateID, "string", "In a parking lot: the entity the message is about, when its payload could be read."},
	{resend.HeaderOriginalKey, "string", "In a parking lot: the routing key it was first published with."},
	{resend.HeaderReplayedAt, "date-time", "After a replay from the parking lot: when."},
	{resend.HeaderReplayCount, "integer", "After a replay from the parking lot: how many times it was replayed."},
	{resend.HeaderReplayID, "string", "After a replay from the parking lot: the replay that moved it last (a replay leaves alone what it moved once)."},
}

// parseDelivery validates the envelope of raw. The Delivery is returned
// even on error, filled as far as it could be; its payload is decoded once
// its handler is known (Consumer.handlerOf).
func parseDelivery(raw amqp.Delivery) (*Delivery, error) {
	d := &Delivery{
		MessageID:     raw.MessageId,
		Type:          raw.Type,
		CorrelationID: raw.CorrelationId,
		CausationID:   messaging.HeaderString(raw.Headers, messaging.HeaderCausationID),
		Attempt:       max(resend.Int(raw.Headers, HeaderRetryAttempt), 1),
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
	if d.Version = resend.ToInt(v); d.Version < 1 {
		return d, Permanent("unsupported_version", fmt.Errorf("message_version %v is not a positive integer", v))
	}
	if raw.ContentType != "" && raw.ContentType != messaging.ContentTypeJSON {
		return d, Permanent("malformed_message", fmt.Errorf("content type %q, want %s", raw.ContentType, messaging.ContentTypeJSON))
	}
	return d, nil
}

func (d *Delivery) inboxEntry(consumer string) entry {
	sum := sha256.Sum256(d.Body)
	return entry{
		Consumer: consumer, MessageID: d.MessageID, Type: d.Type, Version: d.Version,
		AggregateID: d.AggregateID(), PayloadHash: hex.EncodeToString(sum[:]),
		CorrelationID: d.CorrelationID, CausationID: d.CausationID, TraceID: d.TraceID,
	}
}
