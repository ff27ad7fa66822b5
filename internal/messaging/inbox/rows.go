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

// entry is what the inbox records of a delivered message.
type entry struct {
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

// decision says what to do with a delivery.
type decision struct {
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

// beginSeen decides, for a delivery whose inbox row exists already (its
// insert, insertRows, found the row), what the consumer does:
//   - PROCESSED: a duplicate, process nothing;
//   - PROCESSING, started less than lease ago: busy elsewhere;
//   - anything else (a failed attempt, a parked message replayed, a
//     PROCESSING row whose worker died): process again.
func beginSeen(ctx context.Context, tx database.DBTX, e entry, lease time.Duration) (decision, error) {
	hash, err := queries.TouchProcessedInbox(ctx, tx, dbsqlc.TouchProcessedInboxParams{ConsumerName: e.Consumer, MessageID: e.MessageID})
	if err == nil { // the common case of a row seen before: a duplicate, in one statement
		return decision{Duplicate: true, PayloadMismatch: hash != e.PayloadHash}, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) { // no row back: not PROCESSED
		return decision{}, fmt.Errorf("touch processed inbox row: %w", err)
	}

	row, err := queries.LockInbox(ctx, tx, dbsqlc.LockInboxParams{LeaseSeconds: lease.Seconds(), ConsumerName: e.Consumer, MessageID: e.MessageID})
	if err != nil {
		return decision{}, fmt.Errorf("lock inbox row: %w", database.Translate(err))
	}
	switch {
	case row.Status == StatusProcessed:
		if err := queries.TouchInbox(ctx, tx, dbsqlc.TouchInboxParams{ConsumerName: e.Consumer, MessageID: e.MessageID}); err != nil {
			return decision{}, fmt.Errorf("touch inbox row: %w", database.Translate(err))
		}
		return decision{Duplicate: true, PayloadMismatch: row.PayloadHash != e.PayloadHash}, nil
	case row.Status == StatusProcessing && !row.Stale:
		return decision{Busy: true}, nil
	}
	attempt, err := queries.RestartInbox(ctx, tx, dbsqlc.RestartInboxParams{TraceID: database.NilIfEmpty(e.TraceID), ConsumerName: e.Consumer, MessageID: e.MessageID})
	if err != nil {
		return decision{}, fmt.Errorf("restart inbox row: %w", database.Translate(err))
	}
	return decision{Process: true, Attempt: int(attempt)}, nil
}

// insertion is what insertRows did for one delivery of a batch.
type insertion struct {
	// Inserted: the delivery inserted its row, a first delivery, to
	// process as attempt 1. Else it found its row (written before, or by
	// an entry earlier in the batch with the same message id) and goes
	// through beginSeen, at its turn in the batch.
	Inserted bool
	// EarlierParked is, for a row inserted with lookParked, what
	// earlierParked would return for it: the insert looked in the same
	// statement.
	EarlierParked string
}

// insertRows records the deliveries of a batch to consumer, in one
// statement, and says for each entry whether it inserted its row. The row
// is written as it will be when the transaction commits (PROCESSED,
// APPLIED): nobody sees it before then, and a rollback takes it away with
// the effect. A concurrent delivery of the same message waits on its
// key's lock (lockKeys) until this transaction ends, then sees what it
// committed. With lookParked (an ordered worker, whose admit holds a
// message behind a parked earlier one of its aggregate), the same
// statement looks for that earlier message of each row it inserts, which
// spares a first delivery the lookup of its own.
func insertRows(ctx context.Context, tx database.DBTX, consumer string, entries []entry, lookParked bool) ([]insertion, error) {
	p := dbsqlc.InsertInboxRowsParams{LookParked: lookParked, ConsumerName: consumer}
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
	if err := lockKeys(ctx, tx, consumer, p.MessageIds...); err != nil {
		return nil, err
	}
	rows, err := queries.InsertInboxRows(ctx, tx, p)
	if err != nil {
		return nil, fmt.Errorf("insert %d inbox rows: %w", len(entries), database.Translate(err))
	}
	fresh := make(map[string]string, len(rows)) // message id -> earlier parked one
	for _, r := range rows {
		fresh[r.MessageID] = r.EarlierParkedID
	}
	inserted := make([]insertion, len(entries))
	for i, e := range entries {
		if parked, ok := fresh[e.MessageID]; ok {
			inserted[i] = insertion{Inserted: true, EarlierParked: parked}
			delete(fresh, e.MessageID) // a second copy of the message in the batch found the first one's row
		}
	}
	return inserted, nil
}

// markProcessed records, in the transaction of the effect, how a
// message ended: outcome APPLIED, or IGNORED with the reason.
func markProcessed(ctx context.Context, tx database.DBTX, consumer, messageID, outcome, reason string) error {
	err := queries.MarkInboxProcessed(ctx, tx, dbsqlc.MarkInboxProcessedParams{
		Outcome: &outcome, OutcomeReason: database.NilIfEmpty(reason), ConsumerName: consumer, MessageID: messageID,
	})
	if err != nil {
		return fmt.Errorf("mark inbox row processed: %w", database.Translate(err))
	}
	return nil
}

// hold leaves the row PROCESSING when the transaction commits: the
// first step of a two-step side effect. markProcessed ends it.
func hold(ctx context.Context, tx database.DBTX, consumer, messageID string) error {
	if err := queries.HoldInbox(ctx, tx, dbsqlc.HoldInboxParams{ConsumerName: consumer, MessageID: messageID}); err != nil {
		return fmt.Errorf("hold inbox row: %w", database.Translate(err))
	}
	return nil
}

// errTakenOver says that another delivery took a message over (its
// processing lease ran out) while this attempt was between the two steps
// of an external side effect: this attempt records nothing.
var errTakenOver = errors.New("another delivery took the message over after the processing lease")

// fence locks the row of a message held PROCESSING by attempt, in the
// transaction of the second step of an external side effect, or returns
// errTakenOver when the row is no longer that attempt's.
func fence(ctx context.Context, tx database.DBTX, consumer, messageID string, attempt int) error {
	_, err := queries.FenceInbox(ctx, tx, dbsqlc.FenceInboxParams{ConsumerName: consumer, MessageID: messageID, Attempt: int32(attempt)})
	if errors.Is(err, pgx.ErrNoRows) {
		return errTakenOver
	} else if err != nil {
		return fmt.Errorf("fence inbox row: %w", err)
	}
	return nil
}

// fenceProcessed is fence then markProcessed (APPLIED), in one statement:
// the second step of a call that succeeded.
func fenceProcessed(ctx context.Context, tx database.DBTX, consumer, messageID string, attempt int) error {
	_, err := queries.FenceInboxProcessed(ctx, tx, dbsqlc.FenceInboxProcessedParams{ConsumerName: consumer, MessageID: messageID, Attempt: int32(attempt)})
	if errors.Is(err, pgx.ErrNoRows) {
		return errTakenOver
	} else if err != nil {
		return fmt.Errorf("fence and mark inbox row processed: %w", err)
	}
	return nil
}

// failedAttempt is a failed processing attempt.
type failedAttempt struct {
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

// errProcessed says that a message's row is PROCESSED: a failure of
// another delivery of it is not recorded, since what committed stays.
var errProcessed = errors.New("the message is PROCESSED already")

// recordFailure writes a failed attempt of e in transaction db, after the
// transaction of the attempt rolled back, and returns the row's attempt count. It never
// touches a PROCESSED row (errProcessed): what committed stays; nor a row
// another attempt holds PROCESSING within its lease (errTakenOver): a
// failure recorded late, after a takeover, must not undo the takeover.
func recordFailure(ctx context.Context, db database.DBTX, e entry, f failedAttempt) (int, error) {
	if err := lockKeys(ctx, db, e.Consumer, e.MessageID); err != nil {
		return 0, err
	}
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
			return 0, fmt.Errorf("%w: message %s, consumer %s", errProcessed, e.MessageID, e.Consumer)
		default:
			return 0, fmt.Errorf("%w: message %s, consumer %s, attempt %d holds it", errTakenOver, e.MessageID, e.Consumer, current.AttemptCount)
		}
	}
	if err != nil {
		return 0, fmt.Errorf("record inbox failure: %w", database.Translate(err))
	}
	return int(row.AttemptCount), nil
}

// earlierParked returns the id of a parked (PERMANENT_FAILED or POISONED)
// message of e's aggregate for e's consumer that arrived before e, or "".
func earlierParked(ctx context.Context, db database.DBTX, e entry) (string, error) {
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

// markRedelivered records a redelivered message that has no row yet as
// RETRYABLE_FAILED (MarkRedeliveredInbox), in a transaction of its own.
func markRedelivered(ctx context.Context, db beginner, e entry) error {
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if err := lockKeys(ctx, tx, e.Consumer, e.MessageID); err != nil {
			return err
		}
		return queries.MarkRedeliveredInbox(ctx, tx, dbsqlc.MarkRedeliveredInboxParams{
			ConsumerName: e.Consumer, MessageID: e.MessageID, MessageType: e.Type, MessageVersion: int32(e.Version),
			AggregateID: e.AggregateID, PayloadHash: e.PayloadHash, CorrelationID: e.CorrelationID, CausationID: e.CausationID, TraceID: e.TraceID,
		})
	})
	if err != nil {
		return fmt.Errorf("record the redelivery of %s: %w", e.MessageID, database.Translate(err))
	}
	return nil
}

// beginner starts a transaction: a pool, or a transaction (a savepoint).
type beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// lockKeys takes, for transaction tx, the lock of each of consumer's
// message ids (LockInboxKeys): the inbox's deduplication guard, since no
// unique index holds (consumer_name, message_id) alone in a table
// partitioned by time. A transaction that looks a message's row up and
// may insert it takes it first, in a statement of its own, so that the
// lookup's snapshot is taken after the wait.
func lockKeys(ctx context.Context, tx database.DBTX, consumer string, ids ...string) error {
	if err := queries.LockInboxKeys(ctx, tx, dbsqlc.LockInboxKeysParams{ConsumerName: consumer, MessageIds: ids}); err != nil {
		return fmt.Errorf("lock the inbox keys of %d messages: %w", len(ids), database.Translate(err))
	}
	return nil
}
