package inbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/messaging/inbox/dbsqlc"
)

var queries = dbsqlc.New()

// The statuses of an inbox row (docs/state-machines.md).
const (
	StatusProcessing      = "PROCESSING"
	StatusProcessed       = "PROCESSED"
	StatusRetryableFailed = "RETRYABLE_FAILED"
	StatusPermanentFailed = "PERMANENT_FAILED"
	StatusPoisoned        = "POISONED"
)

// Outcomes of a PROCESSED message.
const (
	OutcomeApplied = "APPLIED"
	OutcomeIgnored = "IGNORED"
)

// Entry is what the inbox records of a delivered message.
type Entry struct {
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

// Decision says what to do with a delivery.
type Decision struct {
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

// Begin records the delivery of e in tx and decides, on the inbox row,
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
func Begin(ctx context.Context, tx database.DBTX, e Entry, lease time.Duration) (Decision, error) {
	attempt, err := queries.InsertInbox(ctx, tx, dbsqlc.InsertInboxParams{
		ConsumerName: e.Consumer, MessageID: e.MessageID, MessageType: e.Type, MessageVersion: int32(e.Version),
		AggregateID: database.NilIfEmpty(e.AggregateID), PayloadHash: e.PayloadHash, CorrelationID: database.NilIfEmpty(e.CorrelationID),
		CausationID: database.NilIfEmpty(e.CausationID), TraceID: database.NilIfEmpty(e.TraceID),
	})
	if err == nil {
		return Decision{Process: true, Attempt: int(attempt)}, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) { // no row back: the row exists
		return Decision{}, fmt.Errorf("insert inbox row: %w", err)
	}
	return beginSeen(ctx, tx, e, lease)
}

// beginSeen is Begin for a delivery whose inbox row exists already: its
// insert found the row (InsertInbox or insertRows returned nothing for it).
func beginSeen(ctx context.Context, tx database.DBTX, e Entry, lease time.Duration) (Decision, error) {
	hash, err := queries.TouchProcessedInbox(ctx, tx, dbsqlc.TouchProcessedInboxParams{ConsumerName: e.Consumer, MessageID: e.MessageID})
	if err == nil { // the common case of a row seen before: a duplicate, in one statement
		return Decision{Duplicate: true, PayloadMismatch: hash != e.PayloadHash}, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) { // no row back: not PROCESSED
		return Decision{}, fmt.Errorf("touch processed inbox row: %w", err)
	}

	row, err := queries.LockInbox(ctx, tx, dbsqlc.LockInboxParams{LeaseSeconds: lease.Seconds(), ConsumerName: e.Consumer, MessageID: e.MessageID})
	if err != nil {
		return Decision{}, fmt.Errorf("lock inbox row: %w", database.Translate(err))
	}
	switch {
	case row.Status == StatusProcessed:
		if err := queries.TouchInbox(ctx, tx, dbsqlc.TouchInboxParams{ConsumerName: e.Consumer, MessageID: e.MessageID}); err != nil {
			return Decision{}, fmt.Errorf("touch inbox row: %w", database.Translate(err))
		}
		return Decision{Duplicate: true, PayloadMismatch: row.PayloadHash != e.PayloadHash}, nil
	case row.Status == StatusProcessing && !row.Stale:
		return Decision{Busy: true}, nil
	}
	attempt, err := queries.RestartInbox(ctx, tx, dbsqlc.RestartInboxParams{TraceID: database.NilIfEmpty(e.TraceID), ConsumerName: e.Consumer, MessageID: e.MessageID})
	if err != nil {
		return Decision{}, fmt.Errorf("restart inbox row: %w", database.Translate(err))
	}
	return Decision{Process: true, Attempt: int(attempt)}, nil
}

// insertRows is Begin's insert for the entries of a batch of deliveries to
// consumer, all in one statement. It says, for each entry, whether it
// inserted its row: a first delivery, to process as attempt 1, as Begin
// would decide. Each of the others found its row (written before, or by an
// entry earlier in entries with the same message id) and goes through
// beginSeen, at its turn in the batch, as Begin would take it.
func insertRows(ctx context.Context, tx database.DBTX, consumer string, entries []Entry) ([]bool, error) {
	p := dbsqlc.InsertInboxRowsParams{ConsumerName: consumer}
	for _, e := range entries {
		p.MessageIds = append(p.MessageIds, e.MessageID)
		p.MessageTypes = append(p.MessageTypes, e.Type)
		p.MessageVersions = append(p.MessageVersions, int32(e.Version))
		p.AggregateIds = append(p.AggregateIds, e.AggregateID)
		p.PayloadHashes = append(p.PayloadHashes, e.PayloadHash)
		p.CorrelationIds = append(p.CorrelationIds, e.CorrelationID)
		p.CausationIds = append(p.CausationIds, e.CausationID)
		p.TraceIds = append(p.TraceIds, e.TraceID)
	}
	ids, err := queries.InsertInboxRows(ctx, tx, p)
	if err != nil {
		return nil, fmt.Errorf("insert %d inbox rows: %w", len(entries), database.Translate(err))
	}
	fresh := make(map[string]bool, len(ids))
	for _, id := range ids {
		fresh[id] = true
	}
	inserted := make([]bool, len(entries))
	for i, e := range entries {
		inserted[i] = fresh[e.MessageID]
		delete(fresh, e.MessageID) // a second copy of the message in the batch found the first one's row
	}
	return inserted, nil
}

// MarkProcessed records, in the transaction of the effect, how a
// message ended: outcome APPLIED, or IGNORED with the reason.
func MarkProcessed(ctx context.Context, tx database.DBTX, consumer, messageID, outcome, reason string) error {
	err := queries.MarkInboxProcessed(ctx, tx, dbsqlc.MarkInboxProcessedParams{
		Outcome: &outcome, OutcomeReason: database.NilIfEmpty(reason), ConsumerName: consumer, MessageID: messageID,
	})
	if err != nil {
		return fmt.Errorf("mark inbox row processed: %w", database.Translate(err))
	}
	return nil
}

// Hold leaves the row PROCESSING when the transaction commits: the
// first step of a two-step side effect. MarkProcessed ends it.
func Hold(ctx context.Context, tx database.DBTX, consumer, messageID string) error {
	if err := queries.HoldInbox(ctx, tx, dbsqlc.HoldInboxParams{ConsumerName: consumer, MessageID: messageID}); err != nil {
		return fmt.Errorf("hold inbox row: %w", database.Translate(err))
	}
	return nil
}

// ErrTakenOver says that another delivery took a message over (its
// processing lease ran out) while this attempt was between the two steps
// of an external side effect: this attempt records nothing.
var ErrTakenOver = errors.New("another delivery took the message over after the processing lease")

// Fence locks the row of a message held PROCESSING by attempt, in the
// transaction of the second step of an external side effect, or returns
// ErrTakenOver when the row is no longer that attempt's.
func Fence(ctx context.Context, tx database.DBTX, consumer, messageID string, attempt int) error {
	_, err := queries.FenceInbox(ctx, tx, dbsqlc.FenceInboxParams{ConsumerName: consumer, MessageID: messageID, Attempt: int32(attempt)})
	if errors.Is(err, pgx.ErrNoRows) {
		return ErrTakenOver
	} else if err != nil {
		return fmt.Errorf("fence inbox row: %w", err)
	}
	return nil
}

// fenceProcessed is Fence then MarkProcessed (APPLIED), in one statement:
// the second step of a call that succeeded.
func fenceProcessed(ctx context.Context, tx database.DBTX, consumer, messageID string, attempt int) error {
	_, err := queries.FenceInboxProcessed(ctx, tx, dbsqlc.FenceInboxProcessedParams{ConsumerName: consumer, MessageID: messageID, Attempt: int32(attempt)})
	if errors.Is(err, pgx.ErrNoRows) {
		return ErrTakenOver
	} else if err != nil {
		return fmt.Errorf("fence and mark inbox row processed: %w", err)
	}
	return nil
}

// Failure is a failed processing attempt.
type Failure struct {
	Status  string // RETRYABLE_FAILED, PERMANENT_FAILED or POISONED
	Code    string // a short, stable error code
	Message string // what went wrong, without payload data
	// HeldAttempt is the attempt whose committed hold the failure ends: a
	// failed external call, after its first step committed the row
	// PROCESSING. 0 when the attempt committed nothing.
	HeldAttempt int
	// Lease is the processing lease: a PROCESSING row another attempt
	// holds is left alone while its lease runs. 0 treats every hold as
	// expired (tools, tests).
	Lease time.Duration
}

// ErrProcessed says that a message's row is PROCESSED: a failure of
// another delivery of it is not recorded, since what committed stays.
var ErrProcessed = errors.New("the message is PROCESSED already")

// RecordFailure writes a failed attempt of e, after the transaction of
// the attempt rolled back, and returns the row's attempt count. It never
// touches a PROCESSED row (ErrProcessed): what committed stays; nor a row
// another attempt holds PROCESSING within its lease (ErrTakenOver): a
// failure recorded late, after a takeover, must not undo the takeover.
func RecordFailure(ctx context.Context, db database.DBTX, e Entry, f Failure) (int, error) {
	row, err := queries.RecordInboxFailure(ctx, db, dbsqlc.RecordInboxFailureParams{
		ConsumerName: e.Consumer, MessageID: e.MessageID, MessageType: e.Type, MessageVersion: int32(e.Version),
		AggregateID: database.NilIfEmpty(e.AggregateID), Status: f.Status, PayloadHash: e.PayloadHash,
		LastErrorCode: database.NilIfEmpty(f.Code), LastErrorMessage: database.NilIfEmpty(f.Message),
		CorrelationID: database.NilIfEmpty(e.CorrelationID), CausationID: database.NilIfEmpty(e.CausationID), TraceID: database.NilIfEmpty(e.TraceID),
		HeldAttempt: int32(f.HeldAttempt), LeaseSeconds: f.Lease.Seconds(),
	})
	if errors.Is(err, pgx.ErrNoRows) { // the row is there, and not ours to change: whose is it?
		current, getErr := queries.GetInbox(ctx, db, dbsqlc.GetInboxParams{ConsumerName: e.Consumer, MessageID: e.MessageID})
		switch {
		case getErr != nil:
			return 0, fmt.Errorf("record inbox failure: %w", database.Translate(getErr))
		case current.Status == StatusProcessed:
			return 0, fmt.Errorf("%w: message %s, consumer %s", ErrProcessed, e.MessageID, e.Consumer)
		default:
			return 0, fmt.Errorf("%w: message %s, consumer %s, attempt %d holds it", ErrTakenOver, e.MessageID, e.Consumer, current.AttemptCount)
		}
	}
	if err != nil {
		return 0, fmt.Errorf("record inbox failure: %w", database.Translate(err))
	}
	return int(row.AttemptCount), nil
}

// Row is the stored state of one message for one consumer.
type Row struct {
	Status, Outcome, OutcomeReason, LastErrorCode, LastErrorMessage string
	Attempts                                                        int
}

// Get reads the inbox row of a message (tests, tools).
func Get(ctx context.Context, db database.DBTX, consumer, messageID string) (Row, error) {
	row, err := queries.GetInbox(ctx, db, dbsqlc.GetInboxParams{ConsumerName: consumer, MessageID: messageID})
	if err != nil {
		return Row{}, fmt.Errorf("get inbox row: %w", database.Translate(err))
	}
	return Row{
		Status: row.Status, Outcome: database.Deref(row.Outcome), OutcomeReason: database.Deref(row.OutcomeReason),
		LastErrorCode: database.Deref(row.LastErrorCode), LastErrorMessage: database.Deref(row.LastErrorMessage), Attempts: int(row.AttemptCount),
	}, nil
}

// DeleteProcessed deletes up to limit rows processed longer than
// retention ago, and says how many.
func DeleteProcessed(ctx context.Context, db database.DBTX, retention time.Duration, limit int) (int64, error) {
	n, err := queries.DeleteProcessedInbox(ctx, db, dbsqlc.DeleteProcessedInboxParams{RetentionSeconds: retention.Seconds(), MaxRows: int32(limit)})
	if err != nil {
		return 0, fmt.Errorf("delete processed inbox rows: %w", database.Translate(err))
	}
	return n, nil
}

// Stat counts the rows of one consumer in one status (not PROCESSED).
type Stat struct {
	Consumer, Status string
	Rows             int64
	OldestAge        time.Duration
}

// Stats counts the inbox rows that are not PROCESSED.
func Stats(ctx context.Context, db database.DBTX) ([]Stat, error) {
	rows, err := queries.InboxStats(ctx, db)
	if err != nil {
		return nil, fmt.Errorf("inbox stats: %w", database.Translate(err))
	}
	out := make([]Stat, len(rows))
	for i, r := range rows {
		out[i] = Stat{Consumer: r.ConsumerName, Status: r.Status, Rows: r.RowCount,
			OldestAge: time.Duration(r.OldestAgeSeconds * float64(time.Second))}
	}
	return out, nil
}

// earlierParked returns the id of a parked (PERMANENT_FAILED or POISONED)
// message of e's aggregate for e's consumer that arrived before e, or "".
func earlierParked(ctx context.Context, db database.DBTX, e Entry) (string, error) {
	id, err := queries.EarlierParkedOfAggregate(ctx, db, dbsqlc.EarlierParkedOfAggregateParams{
		ConsumerName: e.Consumer, AggregateID: database.NilIfEmpty(e.AggregateID), MessageID: e.MessageID,
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("look for a parked earlier message of aggregate %s: %w", e.AggregateID, database.Translate(err))
	}
	return id, nil
}

// ForgetFailure deletes the failed row (RETRYABLE_FAILED, PERMANENT_FAILED
// or POISONED) of a message an operator discarded for good, and reports
// whether there was one. With partitions, the later messages of its
// aggregate parked behind it may then be replayed. A PROCESSED row stays.
func ForgetFailure(ctx context.Context, db database.DBTX, consumer, messageID string) (bool, error) {
	n, err := queries.ForgetFailedInbox(ctx, db, dbsqlc.ForgetFailedInboxParams{ConsumerName: consumer, MessageID: messageID})
	if err != nil {
		return false, fmt.Errorf("forget the failure of %s: %w", messageID, database.Translate(err))
	}
	return n > 0, nil
}
