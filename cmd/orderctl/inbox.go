package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/messaging/inbox"
	"github.com/yourorg/orders/internal/store"
)

// InboxRow is one row of message_inbox, every column.
type InboxRow struct {
	Consumer         string     `json:"consumer_name"`
	MessageID        string     `json:"message_id"`
	Type             string     `json:"message_type"`
	Version          int        `json:"message_version"`
	AggregateID      string     `json:"aggregate_id"`
	Status           string     `json:"status"`
	Outcome          string     `json:"outcome"`
	OutcomeReason    string     `json:"outcome_reason"`
	Attempts         int        `json:"attempt_count"`
	PayloadHash      string     `json:"payload_hash"`
	FirstReceivedAt  time.Time  `json:"first_received_at"`
	LastReceivedAt   time.Time  `json:"last_received_at"`
	ProcessingSince  *time.Time `json:"processing_started_at"`
	ProcessedAt      *time.Time `json:"processed_at"`
	LastErrorCode    string     `json:"last_error_code"`
	LastErrorMessage string     `json:"last_error_message"`
	CorrelationID    string     `json:"correlation_id"`
	CausationID      string     `json:"causation_id"`
	TraceID          string     `json:"trace_id"`
}

const inboxColumns = `consumer_name, message_id, message_type, message_version, coalesce(aggregate_id, ''), status,
	coalesce(outcome, ''), coalesce(outcome_reason, ''), attempt_count, payload_hash, first_received_at, last_received_at,
	processing_started_at, processed_at, coalesce(last_error_code, ''), coalesce(last_error_message, ''),
	coalesce(correlation_id, ''), coalesce(causation_id, ''), coalesce(trace_id, '')`

func scanInboxRow(r pgx.CollectableRow) (InboxRow, error) {
	var x InboxRow
	return x, r.Scan(&x.Consumer, &x.MessageID, &x.Type, &x.Version, &x.AggregateID, &x.Status, &x.Outcome, &x.OutcomeReason,
		&x.Attempts, &x.PayloadHash, &x.FirstReceivedAt, &x.LastReceivedAt, &x.ProcessingSince, &x.ProcessedAt,
		&x.LastErrorCode, &x.LastErrorMessage, &x.CorrelationID, &x.CausationID, &x.TraceID)
}

// readInboxRow reads the row of one message for one consumer
// (domain.ErrNotFound when there is none).
func readInboxRow(ctx context.Context, db database.DBTX, consumer, messageID string) (InboxRow, error) {
	rows, err := db.Query(ctx, `SELECT `+inboxColumns+` FROM message_inbox WHERE consumer_name = $1 AND message_id = $2`, consumer, messageID)
	if err != nil {
		return InboxRow{}, fmt.Errorf("read inbox row: %w", err)
	}
	row, err := pgx.CollectExactlyOneRow(rows, scanInboxRow)
	if err != nil {
		return InboxRow{}, fmt.Errorf("inbox row of %s for %s: %w", messageID, consumer, store.Translate(err))
	}
	return row, nil
}

func inboxShow(ctx context.Context, c *ctl) (report, error) {
	row, err := readInboxRow(ctx, c.pool, c.args.pos[0], c.args.pos[1])
	if err != nil {
		return nil, err
	}
	return row, nil
}

func (x InboxRow) human(w io.Writer) {
	table(w, []string{"  field", "value"}, [][]string{
		{"  consumer_name", x.Consumer}, {"  message_id", x.MessageID}, {"  message_type", fmt.Sprintf("%s v%d", x.Type, x.Version)},
		{"  aggregate_id", orDash(x.AggregateID)}, {"  status", x.Status}, {"  outcome", orDash(x.Outcome)},
		{"  outcome_reason", orDash(x.OutcomeReason)}, {"  attempt_count", fmt.Sprint(x.Attempts)},
		{"  last_error", orDash(x.LastErrorCode) + " " + x.LastErrorMessage},
		{"  first_received_at", when(&x.FirstReceivedAt)}, {"  last_received_at", when(&x.LastReceivedAt)},
		{"  processing_started_at", when(x.ProcessingSince)}, {"  processed_at", when(x.ProcessedAt)},
		{"  correlation_id", orDash(x.CorrelationID)}, {"  causation_id", orDash(x.CausationID)}, {"  trace_id", orDash(x.TraceID)},
		{"  payload_hash", x.PayloadHash},
	})
	if hint := x.next(); hint != "" {
		_, _ = fmt.Fprintf(w, "next: %s\n", hint)
	}
}

// next says what to do about the row.
func (x InboxRow) next() string {
	switch x.Status {
	case inbox.StatusPermanentFailed, inbox.StatusPoisoned:
		return fmt.Sprintf("it is parked: orderctl parked show %s %s", x.Consumer, x.MessageID)
	case inbox.StatusRetryableFailed:
		return "it waits in a retry queue; nothing to do unless it ends POISONED"
	case inbox.StatusProcessing:
		return "a two-step effect between its steps: the next delivery takes over after CONSUMER_PROCESSING_LEASE; if none comes, replay it"
	}
	if x.ProcessedAt != nil && x.LastReceivedAt.After(*x.ProcessedAt) {
		return "done; delivered again after it was processed (a duplicate, acknowledged without effect)"
	}
	return ""
}
