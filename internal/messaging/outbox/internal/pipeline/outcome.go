package pipeline

// Outcome is what became of one row handed to the publisher
// (Publisher.Await), or held back (Held).
type Outcome struct {
	Row    Row
	Result string // a publish-attempt outcome, below
	Reason string // for failures: what goes into last_error
}

// Held is the outcome of a row not published because a reader's queue of
// its type is missing (outbox.Config.Readers): handed back, not an attempt.
func Held(row Row) Outcome {
	return Outcome{Row: row, Result: ResultHeld, Reason: "held back: a reader's queue of its type is missing (order-consumer declare)"}
}

// HeldBehind is the outcome of a row not published because an earlier
// message of its aggregate was not (the log-tailing relay's stream): handed
// back, not an attempt, for a claim, which publishes it after that one.
func HeldBehind(row Row) Outcome {
	return Outcome{Row: row, Result: ResultHeld, Reason: "held back behind an earlier message of its aggregate that was not published"}
}

// Confirmed reports whether the broker confirmed the publish.
func (o Outcome) Confirmed() bool { return o.Result == ResultConfirmed }

// Settled reports whether the broker answered the publish (confirmed,
// returned or nacked it), or the row was held: whether its outcome can be
// written. The others (no confirm in time, the connection lost, never
// published) leave the row as it was.
func (o Outcome) Settled() bool {
	switch o.Result {
	case ResultConfirmed, ResultUnroutable, ResultNacked, ResultHeld:
		return true
	}
	return false
}

// Publish attempt outcomes (the "outcome" label of outbox.publish.attempts).
const (
	ResultConfirmed      = "confirmed"
	ResultNacked         = "nacked"
	ResultUnroutable     = "unroutable"
	ResultTimeout        = "timeout"
	ResultConnectionLost = "connection_lost"
	ResultNotPublished   = "not_published"
	ResultShutdown       = "shutdown"
	ResultHeld           = "held" // not published: Held; not an attempt
)
