package main

import (
	"context"
	"fmt"
	"io"

	"github.com/yourorg/orders/internal/messaging/inbox"
	"github.com/yourorg/orders/internal/messaging/inbox/inboxadmin"
)

// InboxRow is every column of one inbox row, as inboxadmin.Get reads it.
type InboxRow inboxadmin.Row

func inboxShow(ctx context.Context, c *ctl) (report, error) {
	row, err := inboxadmin.Get(ctx, c.pool, c.args.pos[0], c.args.pos[1])
	if err != nil {
		return nil, err
	}
	return InboxRow(row), nil
}

func (x InboxRow) human(w io.Writer) {
	table(w, []string{"  field", "value"}, [][]string{
		{"  consumer_name", x.Consumer}, {"  message_id", x.MessageID}, {"  message_type", fmt.Sprintf("%s v%d", x.Type, x.Version)},
		{"  aggregate_id", orDash(x.AggregateID)}, {"  status", x.Status}, {"  outcome", orDash(x.Outcome)},
		{"  outcome_reason", orDash(x.OutcomeReason)}, {"  attempt_count", fmt.Sprint(x.Attempts)},
		{"  last_error", orDash(x.LastErrorCode) + " " + x.LastErrorMessage},
		{"  first_received_at", when(&x.FirstReceivedAt)}, {"  last_received_at", when(&x.LastReceivedAt)},
		{"  processing_started_at", when(x.ProcessingStartedAt)}, {"  processed_at", when(x.ProcessedAt)},
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
