package outbox

import (
	"context"
	"errors"
	"fmt"

	"go.opentelemetry.io/otel/codes"
)

// outcome is what became of one claimed row.
type outcome struct {
	row    Row
	result string // a publish-attempt outcome, below
	reason string // for failures: what goes into last_error
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
	// outcomeHeld: the log stream did not publish the row, a reader queue
	// of its type being missing, and handed it to the sweep. Not an attempt.
	outcomeHeld = "held"
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
			all = append(all, sent{row: row}) // never published: handed back
		}
		outcomes := s.pub.await(ctx, all)
		endBatchSpan(b, outcomes)
		err := r.mark(markCtx, outcomes)
		s.pub.window.Release(int64(len(b.rows)))
		if err != nil {
			return err
		}
		for _, o := range outcomes {
			if o.result == outcomeTimeout && fatal == nil {
				fatal = errors.New("publisher confirm timed out")
				s.pub.stop(fatal)
			}
		}
	}
	return fatal
}

// endBatchSpan ends the span of a batch with what the broker said.
func endBatchSpan(b *batch, outcomes []outcome) {
	failed := 0
	for _, o := range outcomes {
		if o.result != outcomeConfirmed {
			failed++
		}
	}
	if failed > 0 {
		b.batchSpan.SetStatus(codes.Error, fmt.Sprintf("%d of %d messages not confirmed", failed, len(outcomes)))
	}
	b.batchSpan.End()
}
