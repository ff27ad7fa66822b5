package inbox

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"

	"github.com/yourorg/orders/internal/messaging/outbox"
)

// External is a side effect no database transaction can cover (an HTTP
// call to another system), done in two steps:
//
//  1. the handler's transaction records the intent and commits with the
//     inbox row still PROCESSING (the processing lease starts);
//  2. Call runs, outside any transaction, within the lease;
//  3. Record stores the result in a second transaction, fenced by the
//     attempt that made the call, which also marks the inbox row PROCESSED
//     and writes the handler's follow-up messages (Outcome.Publish) if
//     Call succeeded: once, however often the call was retried.
//
// A failed Call is classified like any handler error (retried later, or
// parked). A worker that dies between the steps leaves the row PROCESSING;
// after the processing lease another delivery takes it over and calls
// again, so Call must be idempotent on the other side (an Idempotency-Key).
type External struct {
	Call   func(ctx context.Context) error
	Record func(ctx context.Context, tx pgx.Tx, callErr error) error
}

// secondStep makes the call of an external side effect and records its
// result. The intent is committed, the row still PROCESSING and the
// processing lease running. The call may not outlive the lease: after it,
// another delivery may take the message over. The second step records the
// result, fenced by this attempt: after a takeover it records nothing, so a
// late original can neither run twice nor undo what the takeover recorded.
// While the database is away it waits, with the call's result in hand.
//
// The lease counts from heldAt, not from the commit: in a batch, the
// deliveries after this one ran in the same transaction first. So the call
// ends by 9/10 of the lease after heldAt, however long the commit took; a
// transaction that took longer than that leaves the call no time at all,
// and the row PROCESSING for a retry.
func (w *worker) secondStep(d *delivery, e effect) (result, error) {
	ctx := d.ctx
	d.heldAttempt = e.attempt // a failure from here on ends this attempt's hold
	callCtx, cancel := context.WithDeadline(ctx, e.heldAt.Add(w.cfg.ProcessingLease*9/10))
	callErr := e.external.Call(callCtx)
	cancel()
	err := w.tx(ctx, 1, func(ctx context.Context, tx pgx.Tx) error {
		fenceRow := fence // the row stays PROCESSING: the failed call is retried
		if callErr == nil {
			fenceRow = fenceProcessed // fenced and PROCESSED in one statement
		}
		if err := fenceRow(ctx, tx, w.consumer.name, d.MessageID, e.attempt); err != nil {
			return err
		}
		if err := e.external.Record(ctx, tx, callErr); err != nil || callErr != nil {
			return err
		}
		followUps := outbox.Buffer{Writer: w.cfg.FollowUps}
		if _, err := followUps.Add(ctx, d.Cause(), e.followUps...); err != nil {
			return err
		}
		return followUps.Flush(ctx, tx)
	})
	if errors.Is(err, errTakenOver) {
		return result{outcome: "duplicate", reason: "taken over by another delivery after the processing lease; this attempt recorded nothing"}, nil
	}
	if err != nil {
		return result{}, err
	}
	if callErr != nil {
		return result{}, callErr
	}
	return result{outcome: "processed"}, nil
}
