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
// settings: the same functions (the outbox's drops whole time partitions,
// outboxadmin.DropTimePartitions; the others delete in batches,
// background.Retention.Once).
func retention(ctx context.Context, c *ctl) (report, error) {
	type sweeper struct {
		Sweep
		keep   time.Duration
		delete func(ctx context.Context, db database.DBTX, keep time.Duration, limit int) (int64, error)
	}
	var r retentionReport
	var errs []error
	outbox := Sweep{What: "outbox time partitions (published rows)", Setting: "RELAY_RETENTION", Retention: c.cfg.OutboxRetention.String()}
	if c.cfg.OutboxRetention > 0 {
		parts, err := outboxadmin.DropTimePartitions(ctx, c.pool, c.cfg.OutboxRetention)
		if err != nil {
			outbox.Error = err.Error()
			errs = append(errs, err)
		}
		for _, p := range parts {
			switch {
			case p.Dropped:
				outbox.Deleted++
			case p.PastRetention:
				outbox.Waiting++
			}
		}
	}
	r.Sweeps = append(r.Sweeps, outbox)
	for _, s := range []sweeper{
		{Sweep{What: "processed inbox rows", Setting: "CONSUMER_INBOX_RETENTION"}, c.cfg.InboxRetention, inboxadmin.DeleteProcessed},
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
