package domain

// Cause says what made a change: the HTTP request or the message being
// handled. It goes into the order's history (order_state_transition) and
// into the envelope of every message the change emits, so that a reader can
// follow a flow from the request that began it, message by message. It has
// the fields of the outbox's and the inbox's messaging.Cause, so each
// converts to the other: domain.Cause(d.Cause()).
type Cause struct {
	// MessageID is the message being handled; "" when an HTTP request made
	// the change. The messages the change emits carry it as their
	// causation_id.
	MessageID string
	// CorrelationID ties every change and message of a flow to the request
	// that began it (the X-Correlation-ID of that request).
	CorrelationID string
}
