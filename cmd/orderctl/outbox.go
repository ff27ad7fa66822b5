package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/messaging/outbox/outboxadmin"
)

type failedReport struct {
	Rows []outboxadmin.Message `json:"rows"` // updated_at: when each failed
}

func outboxFailed(ctx context.Context, c *ctl) (report, error) {
	limit := c.args.limit
	if limit == 0 {
		limit = 100
	}
	failed, err := outboxadmin.Failed(ctx, c.pool, c.args.typ, limit)
	if err != nil {
		return nil, err
	}
	return failedReport{Rows: failed}, nil
}

func (r failedReport) human(w io.Writer) {
	if len(r.Rows) == 0 {
		_, _ = fmt.Fprintln(w, "No FAILED outbox rows.")
		return
	}
	var rows [][]string
	for _, f := range r.Rows {
		rows = append(rows, []string{f.ID.String(), f.Type, f.AggregateID, fmt.Sprint(f.Attempts), when(&f.UpdatedAt), f.LastError})
	}
	table(w, []string{"outbox_id", "message_type", "aggregate_id", "attempts", "failed_at", "last_error"}, rows)
	_, _ = fmt.Fprintf(w, "\nFix the cause (docs/operations.md, \"FAILED rows\"), then:\n  orderctl outbox retry %s --reason \"...\"\n  orderctl outbox retry --type %s --reason \"...\"\n",
		r.Rows[0].ID, r.Rows[0].Type)
}

type retryReport struct {
	Retried []outboxadmin.Message `json:"retried"`
	Audit   Audit                 `json:"audit"`
}

// outboxRetry puts FAILED rows back to PENDING and records why, in one
// transaction: the audit row and the change commit together.
func outboxRetry(ctx context.Context, c *ctl) (report, error) {
	var ids []uuid.UUID
	for _, a := range c.args.pos {
		id, err := uuid.Parse(a)
		if err != nil {
			return nil, fmt.Errorf("outbox id %q: %w", a, err)
		}
		ids = append(ids, id)
	}
	if (len(ids) == 0) == (c.args.typ == "") {
		return nil, errors.New("name the outbox ids to retry, or --type T for every FAILED row of a type (not both)")
	}
	target := c.args.typ
	if len(ids) > 0 {
		target = strings.Join(c.args.pos, ",")
	}
	var r retryReport
	// In database.Run, so that the pool's timeouts hold in the transaction.
	err := database.Run(ctx, c.pool, database.Policy{}, func(ctx context.Context, tx pgx.Tx) error {
		var err error
		if r.Retried, err = outboxadmin.RetryFailed(ctx, tx, ids, c.args.typ); err != nil {
			return err
		}
		if len(r.Retried) == 0 {
			return fmt.Errorf("no FAILED outbox row matches %s (orderctl outbox failed lists them)", target)
		}
		r.Audit, err = c.record(ctx, tx, "outbox.retry", target, c.args.reason, map[string]any{"retried": r.Retried})
		return err
	})
	if err != nil {
		return nil, err
	}
	return r, nil
}

func (r retryReport) human(w io.Writer) {
	for _, x := range r.Retried {
		_, _ = fmt.Fprintf(w, "%s  %s  %s: FAILED -> PENDING (was: %s)\n", x.ID, x.Type, x.AggregateID, x.LastError)
	}
	_, _ = fmt.Fprintf(w, "%d row(s) back to PENDING, due now; the relay publishes them with the same message id. Audit #%d.\n", len(r.Retried), r.Audit.ID)
}
