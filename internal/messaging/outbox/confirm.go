package outbox

import (
	"context"
	"errors"
	"fmt"

	"go.opentelemetry.io/otel/codes"

	"github.com/yourorg/orders/internal/messaging/outbox/internal/pipeline"
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
			all = append(all, pipeline.Sent{Row: row}) // never published: handed back
		}
		outcomes := s.pub.Await(ctx, all)
		endBatchSpan(b, outcomes)
		err := r.mark(markCtx, outcomes)
		s.pub.Release(int64(len(b.rows)))
		if err != nil {
			return err
		}
		for _, o := range outcomes {
			if o.Result == pipeline.ResultTimeout && fatal == nil {
				fatal = errors.New("publisher confirm timed out")
				s.pub.Stop(fatal)
			}
		}
	}
	return fatal
}

// endBatchSpan ends the span of a batch with what the broker said.
func endBatchSpan(b *batch, outcomes []pipeline.Outcome) {
	failed := 0
	for _, o := range outcomes {
		if !o.Confirmed() {
			failed++
		}
	}
	if failed > 0 {
		b.batchSpan.SetStatus(codes.Error, fmt.Sprintf("%d of %d messages not confirmed", failed, len(outcomes)))
	}
	b.batchSpan.End()
}
