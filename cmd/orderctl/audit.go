package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/store"
)

// The audit table (migrations/00007_operator_audit.sql): one row per
// command that changed something. orderctl's SQL is plain pgx, here and in
// the other files: a handful of read-only views for people and one insert,
// outside every hot path, whose shapes change with what operators want to
// see; sqlc would add a generated package for them and buy little. The one
// change to a mechanism's own rows, FAILED outbox rows back to PENDING, is
// the outbox's (outboxadmin.RetryFailed, a sqlc query beside the relay's).

// Audit is one row of operator_audit.
type Audit struct {
	ID      int64           `json:"audit_id"`
	At      time.Time       `json:"at"`
	Actor   string          `json:"actor"`
	Action  string          `json:"action"`
	Target  string          `json:"target"`
	Reason  string          `json:"reason"`
	Details json.RawMessage `json:"details"`
}

// record writes an audit row on db: the transaction of the change when
// the change is in the database, so that both or neither commit.
func (c *ctl) record(ctx context.Context, db database.DBTX, action, target, reason string, details any) (Audit, error) {
	b, err := json.Marshal(details)
	if err != nil {
		return Audit{}, fmt.Errorf("audit details: %w", err)
	}
	a := Audit{Actor: c.user, Action: action, Target: target, Reason: reason, Details: b}
	err = db.QueryRow(ctx, `INSERT INTO operator_audit (actor, action, target, reason, details)
		VALUES ($1, $2, $3, $4, $5) RETURNING audit_id, at`, a.Actor, a.Action, a.Target, a.Reason, b).Scan(&a.ID, &a.At)
	if err != nil {
		return Audit{}, fmt.Errorf("record the audit row: %w", store.Translate(err))
	}
	return a, nil
}

type auditReport struct {
	Entries []Audit `json:"entries"`
}

func auditList(ctx context.Context, c *ctl) (report, error) {
	limit := c.args.limit
	if limit == 0 {
		limit = 50
	}
	rows, err := c.pool.Query(ctx, `SELECT audit_id, at, actor, action, target, reason, details
		FROM operator_audit ORDER BY audit_id DESC LIMIT $1`, limit)
	if err != nil {
		return nil, fmt.Errorf("read operator_audit: %w", err)
	}
	entries, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Audit, error) {
		var a Audit
		return a, r.Scan(&a.ID, &a.At, &a.Actor, &a.Action, &a.Target, &a.Reason, &a.Details)
	})
	if err != nil {
		return nil, fmt.Errorf("read operator_audit: %w", err)
	}
	return auditReport{Entries: entries}, nil
}

func (r auditReport) human(w io.Writer) {
	if len(r.Entries) == 0 {
		_, _ = fmt.Fprintln(w, "No operator actions recorded.")
		return
	}
	var rows [][]string
	for _, a := range r.Entries {
		rows = append(rows, []string{fmt.Sprint(a.ID), when(&a.At), a.Actor, a.Action, a.Target, a.Reason, string(a.Details)})
	}
	table(w, []string{"id", "at", "who", "action", "target", "why", "details"}, rows)
}
