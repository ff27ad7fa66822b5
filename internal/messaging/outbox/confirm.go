package outbox

import (
	"context"
	"errors"
	"fmt"

	"go.opentelemetry.io/otel/codes"
)

// Outcome is what became of one row handed to the publisher
// (Publisher.Await), or held back (Held).
type Outcome struct {
	Row    Row
	Result string // a publish-attempt outcome, below
	Reason string // for failures: what goes into last_error
}

// Held is the outcome of a row not published because a reader's queue of
// its type is missing (Config.Readers): handed back, not an attempt.
func Held(row Row) Outcome {
	return Outcome{Row: row, Result: outcomeHeld, Reason: "held back: a reader's queue of its type is missing (order-consumer declare)"}
}

// HeldBehind is the outcome of a row not published because an earlier
// message of its aggregate was not (the log-tailing relay's stream): handed
// back, not an attempt, for a claim, which publishes it after that one.
func HeldBehind(row Row) Outcome {
	return Outcome{Row: row, Result: outcomeHeld, Reason: "held back behind an earlier message of its aggregate that was not published"}
}

// Confirmed reports whether the broker confirmed the publish.
func (o Outcome) Confirmed() bool { return o.Result == outcomeConfirmed }

// Settled reports whether the broker answered the publish (confirmed,
// returned or nacked it), or the row was held: whether its outcome can be
// written. The others (no confirm in time, the connection lost, never
// published) leave the row as it was.
func (o Outcome) Settled() bool {
	switch o.Result {
	case outcomeConfirmed, outcomeUnroutable, outcomeNacked, outcomeHeld:
		return true
	}
	return false
}

// Publish attempt outcomes (the "outcome" label of outbox.publish.attempts).
const (
	outcomeConfirmed      = "confirmed"
	outcomeNacked         = "nacked"
	outcomeUnroutable     = "unroutable"
	outcomeTimeout        = "timeout"
	outcomeConnectionLost = "connection_lost"
	outcomeNotPublished   = "not_published"
	outcomeShutdown       = "shutdown"
	outcomeHeld           = "held" // not published: Held; not an attempt
)

// confirmLoop is steps 3 and 4: for each published batch, in order, it
// waits for the broker's confirms (publisher.await) and marks the rows by
// them (Relay.mark), within markCtx. When ctx ends first (the shutdown
// deadline), unconfirmed rows are handed back untried. A confirm that
// never comes means the channel cannot be trusted: the session ends, and
// the loop goes on marking what is still in flight.
func (s *session) confirmLoop(ctx, markCtx context.Context, published <-chan *batch) error {
	r := s.relay
	var fatal error
	for b := range published {
		all := b.sent
		for _, row := range b.rows[len(b.sent):] {
			all = append(all, Sent{Row: row}) // never published: handed back
		}
		outcomes := s.pub.Await(ctx, all)
		endBatchSpan(b, outcomes)
		err := r.mark(markCtx, outcomes)
		s.pub.Release(int64(len(b.rows)))
		if err != nil {
			return err
		}
		for _, o := range outcomes {
			if o.Result == outcomeTimeout && fatal == nil {
				fatal = errors.New("publisher confirm timed out")
				s.pub.Stop(fatal)
			}
		}
	}
	return fatal
}

// endBatchSpan ends the span of a batch with what the broker said.
func endBatchSpan(b *batch, outcomes []Outcome) {
	failed := 0
	for _, o := range outcomes {
		if o.Result != outcomeConfirmed {
			failed++
		}
	}
	if failed > 0 {
		b.batchSpan.SetStatus(codes.Error, fmt.Sprintf("%d of %d messages not confirmed", failed, len(outcomes)))
	}
	b.batchSpan.End()
}
