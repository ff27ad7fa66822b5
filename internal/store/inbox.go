package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/yourorg/orders/internal/domain"
	"github.com/yourorg/orders/internal/store/dbsqlc"
)

// Inbox statuses (docs/state-machines.md).
const (
	InboxProcessing      = "PROCESSING"
	InboxProcessed       = "PROCESSED"
	InboxRetryableFailed = "RETRYABLE_FAILED"
	InboxPermanentFailed = "PERMANENT_FAILED"
	InboxPoisoned        = "POISONED"
)

// Outcomes of a PROCESSED message.
const (
	OutcomeApplied = "APPLIED"
	OutcomeIgnored = "IGNORED"
)

// InboxEntry is what the inbox records of a delivered message.
type InboxEntry struct {
	Consumer      string
	MessageID     string
	Type          string
	Version       int
	AggregateID   string
	PayloadHash   string
	CorrelationID string
	CausationID   string
	TraceID       string
}

// InboxDecision says what to do with a delivery.
type InboxDecision struct {
	// Process: this delivery owns the message now; apply it in this
	// transaction. The row already reads PROCESSED (APPLIED): that becomes
	// true when, and only if, the transaction commits. Attempt counts the
	// processing attempts so far, this one included.
	Process bool
	Attempt int
	// Duplicate: the message was PROCESSED before; apply nothing.
	Duplicate bool
	// PayloadMismatch: a duplicate whose body differs from the first one:
	// a producer reused a message_id. Worth a warning, not a second effect.
	PayloadMismatch bool
	// Busy: another delivery of the message holds it (a two-step handler
	// between its steps, within its lease).
	Busy bool
}

// BeginInbox records the delivery of e in tx and decides, on the inbox row,
// what the consumer does:
//   - no row yet: insert it and process (the first delivery);
//   - PROCESSED: a duplicate, process nothing;
//   - PROCESSING, started less than lease ago: busy elsewhere;
//   - anything else (a failed attempt, a parked message replayed, a
//     PROCESSING row whose worker died): process again.
//
// A concurrent delivery of the same message waits on the primary key until
// this transaction ends, then sees what it committed. The row is written
// as PROCESSED from the start: nothing outside this transaction sees it
// before the commit, and a rollback removes it together with the effect.
func BeginInbox(ctx context.Context, tx DBTX, e InboxEntry, lease time.Duration) (InboxDecision, error) {
	attempt, err := queries.InsertInbox(ctx, tx, dbsqlc.InsertInboxParams{
		ConsumerName: e.Consumer, MessageID: e.MessageID, MessageType: e.Type, MessageVersion: int32(e.Version),
		AggregateID: nullIfEmpty(e.AggregateID), PayloadHash: e.PayloadHash, CorrelationID: nullIfEmpty(e.CorrelationID),
		CausationID: nullIfEmpty(e.CausationID), TraceID: nullIfEmpty(e.TraceID),
	})
	if err == nil {
		return InboxDecision{Process: true, Attempt: int(attempt)}, nil
	}
	if err = translate(err); !errors.Is(err, domain.ErrNotFound) {
		return InboxDecision{}, fmt.Errorf("insert inbox row: %w", err)
	}

	row, err := queries.LockInbox(ctx, tx, dbsqlc.LockInboxParams{LeaseSeconds: lease.Seconds(), ConsumerName: e.Consumer, MessageID: e.MessageID})
	if err != nil {
		return InboxDecision{}, fmt.Errorf("lock inbox row: %w", translate(err))
	}
	switch {
	case row.Status == InboxProcessed:
		if err := queries.TouchInbox(ctx, tx, dbsqlc.TouchInboxParams{ConsumerName: e.Consumer, MessageID: e.MessageID}); err != nil {
			return InboxDecision{}, fmt.Errorf("touch inbox row: %w", translate(err))
		}
		return InboxDecision{Duplicate: true, PayloadMismatch: row.PayloadHash != e.PayloadHash}, nil
	case row.Status == InboxProcessing && !row.Stale:
		return InboxDecision{Busy: true}, nil
	}
	attempt, err = queries.RestartInbox(ctx, tx, dbsqlc.RestartInboxParams{TraceID: nullIfEmpty(e.TraceID), ConsumerName: e.Consumer, MessageID: e.MessageID})
	if err != nil {
		return InboxDecision{}, fmt.Errorf("restart inbox row: %w", translate(err))
	}
	return InboxDecision{Process: true, Attempt: int(attempt)}, nil
}

// MarkInboxProcessed records, in the transaction of the effect, how a
// message ended: outcome APPLIED, or IGNORED with the reason.
func MarkInboxProcessed(ctx context.Context, tx DBTX, consumer, messageID, outcome, reason string) error {
	err := queries.MarkInboxProcessed(ctx, tx, dbsqlc.MarkInboxProcessedParams{
		Outcome: &outcome, OutcomeReason: nullIfEmpty(reason), ConsumerName: consumer, MessageID: messageID,
	})
	if err != nil {
		return fmt.Errorf("mark inbox row processed: %w", translate(err))
	}
	return nil
}

// HoldInbox leaves the row PROCESSING when the transaction commits: the
// first step of a two-step side effect. MarkInboxProcessed ends it.
func HoldInbox(ctx context.Context, tx DBTX, consumer, messageID string) error {
	if err := queries.HoldInbox(ctx, tx, dbsqlc.HoldInboxParams{ConsumerName: consumer, MessageID: messageID}); err != nil {
		return fmt.Errorf("hold inbox row: %w", translate(err))
	}
	return nil
}

// InboxFailure is a failed processing attempt.
type InboxFailure struct {
	Status  string // RETRYABLE_FAILED, PERMANENT_FAILED or POISONED
	Code    string // a short, stable error code
	Message string // what went wrong, without payload data
}

// RecordInboxFailure writes a failed attempt of e, after the transaction of
// the attempt rolled back, and returns the row's attempt count. A PROCESSED
// row is never touched (domain.ErrConflict): what committed stays.
func RecordInboxFailure(ctx context.Context, db DBTX, e InboxEntry, f InboxFailure) (int, error) {
	row, err := queries.RecordInboxFailure(ctx, db, dbsqlc.RecordInboxFailureParams{
		ConsumerName: e.Consumer, MessageID: e.MessageID, MessageType: e.Type, MessageVersion: int32(e.Version),
		AggregateID: nullIfEmpty(e.AggregateID), Status: f.Status, PayloadHash: e.PayloadHash,
		LastErrorCode: nullIfEmpty(f.Code), LastErrorMessage: nullIfEmpty(f.Message),
		CorrelationID: nullIfEmpty(e.CorrelationID), CausationID: nullIfEmpty(e.CausationID), TraceID: nullIfEmpty(e.TraceID),
	})
	if err != nil {
		if err = translate(err); errors.Is(err, domain.ErrNotFound) {
			return 0, fmt.Errorf("%w: message %s is already PROCESSED by %s", domain.ErrConflict, e.MessageID, e.Consumer)
		}
		return 0, fmt.Errorf("record inbox failure: %w", err)
	}
	return int(row.AttemptCount), nil
}

// InboxRow is the stored state of one message for one consumer.
type InboxRow struct {
	Status, Outcome, OutcomeReason, LastErrorCode, LastErrorMessage string
	Attempts                                                        int
}

// GetInbox reads the inbox row of a message (tests, tools).
func GetInbox(ctx context.Context, db DBTX, consumer, messageID string) (InboxRow, error) {
	row, err := queries.GetInbox(ctx, db, dbsqlc.GetInboxParams{ConsumerName: consumer, MessageID: messageID})
	if err != nil {
		return InboxRow{}, fmt.Errorf("get inbox row: %w", translate(err))
	}
	return InboxRow{
		Status: row.Status, Outcome: deref(row.Outcome), OutcomeReason: deref(row.OutcomeReason),
		LastErrorCode: deref(row.LastErrorCode), LastErrorMessage: deref(row.LastErrorMessage), Attempts: int(row.AttemptCount),
	}, nil
}

// DeleteProcessedInbox deletes up to limit rows processed longer than
// retention ago, and says how many.
func DeleteProcessedInbox(ctx context.Context, db DBTX, retention time.Duration, limit int) (int64, error) {
	n, err := queries.DeleteProcessedInbox(ctx, db, dbsqlc.DeleteProcessedInboxParams{RetentionSeconds: retention.Seconds(), MaxRows: int32(limit)})
	if err != nil {
		return 0, fmt.Errorf("delete processed inbox rows: %w", translate(err))
	}
	return n, nil
}

// InboxStat counts the rows of one consumer in one status (not PROCESSED).
type InboxStat struct {
	Consumer, Status string
	Rows             int64
	OldestAge        time.Duration
}

// InboxStats counts the inbox rows that are not PROCESSED.
func InboxStats(ctx context.Context, db DBTX) ([]InboxStat, error) {
	rows, err := queries.InboxStats(ctx, db)
	if err != nil {
		return nil, fmt.Errorf("inbox stats: %w", translate(err))
	}
	out := make([]InboxStat, len(rows))
	for i, r := range rows {
		out[i] = InboxStat{Consumer: r.ConsumerName, Status: r.Status, Rows: r.RowCount,
			OldestAge: time.Duration(r.OldestAgeSeconds * float64(time.Second))}
	}
	return out, nil
}
