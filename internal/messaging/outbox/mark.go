package outbox

import (
	"context"
	"log/slog"
	"slices"
	"time"

	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/messaging/outbox/internal/pipeline"
)

// mark records the outcomes of a claimed batch (pipeline.Record) and writes them
// with markRows: one statement and one commit per batch, whatever the mix,
// with the pool's settings in force behind a pooler too
// (database.RunStatement). The statement is fenced by the claims' tokens and takes effect whole or
// not at all, so its retries never repeat a change that took effect. If
// the database stays away, the rows stay PUBLISHING and come back when
// their lease ends: published again (a duplicate the inbox absorbs), never
// lost. A mark commits asynchronously, so the relay remembers its claims
// until their lease ends, and gives their rows back when its database
// fails (claimsMarked): a primary that dies may take the last marks
// along.
func (r *Relay) mark(ctx context.Context, outcomes []pipeline.Outcome) error {
	var tokens []string
	for _, o := range outcomes {
		if !slices.Contains(tokens, o.Row.ClaimToken) { // a batch is one claim, or a few
			tokens = append(tokens, o.Row.ClaimToken)
		}
	}
	marked, err := r.pipe.Record(ctx, outcomes, func(ctx context.Context, m pipeline.Marks) (pipeline.Marked, error) {
		var marked pipeline.Marked
		err := database.RunStatement(ctx, r.pool, func(ctx context.Context, db database.DBTX) (err error) {
			marked, err = markRows(ctx, db, m, r.cfg.MaxAttempts)
			return err
		})
		if err != nil {
			r.databaseFailed()
		} else {
			r.claimsMarked(tokens, time.Now())
		}
		return marked, err
	})
	rows := make([]Row, len(outcomes))
	for i, o := range outcomes {
		rows[i] = o.Row
	}
	r.rowsMarked(rows) // held rows behind these are due now: claim at once
	if ctx.Err() != nil {
		return err // a crash (Config.Faults): nothing more is marked
	}
	if err != nil {
		r.log.ErrorContext(ctx, "marking outcomes: giving up; the leases will bring the rows back", slog.String("error", err.Error()))
	}
	confirmed := int64(0)
	for _, o := range outcomes {
		if o.Confirmed() {
			confirmed++
		}
	}
	if lost := confirmed - marked.Published; lost > 0 {
		r.log.WarnContext(ctx, "confirmed rows not marked (lease expired, or the database away); they will be published again",
			slog.Int64("rows", lost))
	}
	return nil
}
