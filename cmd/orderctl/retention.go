package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/yourorg/orders/internal/background"
	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/messaging/inbox/inboxadmin"
	"github.com/yourorg/orders/internal/messaging/outbox/outboxadmin"
	"github.com/yourorg/orders/internal/store"
)

// Sweep is one retention run over one kind of row.
type Sweep struct {
	What      string `json:"what"`
	Setting   string `json:"setting"`
	Retention string `json:"retention"` // "0s": kept forever, nothing deleted
	Deleted   int64  `json:"deleted"`   // rows; of the outbox, time partitions
	// Waiting: the outbox's time partitions past retention that hold rows
	// not PUBLISHED, or published within it; dropped once they hold none.
	Waiting int64  `json:"waiting,omitempty"`
	Error   string `json:"error,omitempty"`
}

type retentionReport struct {
	Sweeps []Sweep `json:"sweeps"`
	Audit  Audit   `json:"audit"`
}

// retention runs, now, the retention the services run, with their
// settings: the same functions (the outbox's and the inbox's drop whole
// time partitions, DropTimePartitions; the idempotency keys' deletes in
// batches, background.Retention.Once).
func retention(ctx context.Context, c *ctl) (report, error) {
	type sweeper struct {
		Sweep
		keep   time.Duration
		delete func(ctx context.Context, db database.DBTX, keep time.Duration, limit int) (int64, error)
	}
	var r retentionReport
	var errs []error
	for _, tp := range []struct {
		Sweep
		keep time.Duration
		drop func(ctx context.Context, keep time.Duration) (dropped, waiting int64, err error)
	}{
		{Sweep{What: "outbox time partitions (published rows)", Setting: "RELAY_RETENTION"}, c.cfg.OutboxRetention,
			func(ctx context.Context, keep time.Duration) (int64, int64, error) {
				parts, err := outboxadmin.DropTimePartitions(ctx, c.pool, keep)
				var dropped, waiting int64
				for _, p := range parts {
					dropped, waiting = dropped+boolCount(p.Dropped), waiting+boolCount(p.PastRetention && !p.Dropped)
				}
				return dropped, waiting, err
			}},
		{Sweep{What: "inbox time partitions (processed rows)", Setting: "CONSUMER_INBOX_RETENTION"}, c.cfg.InboxRetention,
			func(ctx context.Context, keep time.Duration) (int64, int64, error) {
				parts, err := inboxadmin.DropTimePartitions(ctx, c.pool, keep)
				var dropped, waiting int64
				for _, p := range parts {
					dropped, waiting = dropped+boolCount(p.Dropped), waiting+boolCount(p.PastRetention && !p.Dropped)
				}
				return dropped, waiting, err
			}},
	} {
		tp.Retention = tp.keep.String()
		if tp.keep > 0 {
			var err error
			if tp.Deleted, tp.Waiting, err = tp.drop(ctx, tp.keep); err != nil {
				tp.Error = err.Error()
				errs = append(errs, err)
			}
		}
		r.Sweeps = append(r.Sweeps, tp.Sweep)
	}
	for _, s := range []sweeper{
		{Sweep{What: "expired idempotency keys", Setting: "IDEMPOTENCY_KEY_TTL"}, c.cfg.IdempotencyKeyTTL, store.DeleteExpiredIdempotencyKeys},
	} {
		s.Retention = s.keep.String()
		if s.keep > 0 {
			var failure error // Once logs a failure and stops; keep it to report it
			s.Deleted = background.Retention{What: s.What, Logger: c.log, Delete: func(ctx context.Context, limit int) (int64, error) {
				n, err := s.delete(ctx, c.pool, s.keep, limit)
				failure = err
				return n, err
			}}.Once(ctx)
			if failure != nil {
				s.Error = failure.Error()
				errs = append(errs, failure)
			}
		}
		r.Sweeps = append(r.Sweeps, s.Sweep)
	}
	var err error
	r.Audit, err = c.record(ctx, c.pool, "retention", "outbox, inbox, idempotency keys", c.args.reason, map[string]any{"sweeps": r.Sweeps})
	if err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return r, nil
}

func (r retentionReport) human(w io.Writer) {
	var rows [][]string
	for _, s := range r.Sweeps {
		keep := s.Retention
		if keep == "0s" {
			keep = "forever (nothing deleted)"
		}
		deleted := fmt.Sprint(s.Deleted)
		if s.Waiting > 0 {
			deleted += fmt.Sprintf(" (%d waiting for unfinished rows: orderctl status)", s.Waiting)
		}
		rows = append(rows, []string{s.What, s.Setting + "=" + keep, deleted})
	}
	table(w, []string{"rows", "kept for", "deleted"}, rows)
	_, _ = fmt.Fprintf(w, "Audit #%d.\n", r.Audit.ID)
}

func boolCount(b bool) int64 {
	if b {
		return 1
	}
	return 0
}
