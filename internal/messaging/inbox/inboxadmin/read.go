// Package inboxadmin is the inbox as operators, tools, pages and tests see
// it.
//
// The table (read.go): one message's row, one aggregate's rows, the rows
// not PROCESSED, counts by status, and the repairs (forget a discarded
// message's failure, drop the time partitions past their retention). The rest
// of the code reads message_inbox through it (queries/read.sql of package
// inbox), never with SQL of its own, so a change of the table changes
// these functions alone. Each takes the caller's DBTX: a pool, or a
// transaction.
//
// The parking lots: look at parked messages without taking them out and
// discard one for good (Browse, Discard: parked.go), or move them back to
// their work queues (Replay: replay.go).
//
// A team that runs the inbox without these tools deletes this folder.
package inboxadmin

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/messaging/inbox"
	"github.com/yourorg/orders/internal/messaging/inbox/dbsqlc"
	"github.com/yourorg/orders/internal/messaging/tablestats"
)

var queries = dbsqlc.New()

// Row is the stored state of one message for one consumer: every column
// of its inbox row.
type Row struct {
	Consumer            string     `json:"consumer_name"`
	MessageID           string     `json:"message_id"`
	Type                string     `json:"message_type"`
	Version             int        `json:"message_version"`
	AggregateID         string     `json:"aggregate_id"`
	Status              string     `json:"status"`
	Outcome             string     `json:"outcome"` // APPLIED or IGNORED when PROCESSED
	OutcomeReason       string     `json:"outcome_reason"`
	Attempts            int        `json:"attempt_count"`
	PayloadHash         string     `json:"payload_hash"`
	FirstReceivedAt     time.Time  `json:"first_received_at"`
	LastReceivedAt      time.Time  `json:"last_received_at"`
	ProcessingStartedAt *time.Time `json:"processing_started_at"`
	ProcessedAt         *time.Time `json:"processed_at"`
	LastErrorCode       string     `json:"last_error_code"`
	LastErrorMessage    string     `json:"last_error_message"`
	CorrelationID       string     `json:"correlation_id"`
	CausationID         string     `json:"causation_id"`
	TraceID             string     `json:"trace_id"`
}

// Get reads the inbox row of a message for a consumer
// (database.ErrNotFound when there is none).
func Get(ctx context.Context, db database.DBTX, consumer, messageID string) (Row, error) {
	row, err := queries.ReadInbox(ctx, db, dbsqlc.ReadInboxParams{ConsumerName: consumer, MessageID: messageID})
	if err != nil {
		return Row{}, fmt.Errorf("inbox row of %s for %s: %w", messageID, consumer, database.Translate(err))
	}
	return rowOf(row), nil
}

// Aggregate returns every consumer's rows of one aggregate, the first
// delivered first, without their payload hash. It reads through
// inbox_rows_of_aggregate (the inbox's migration 00002), so a role without
// SELECT on the table may call it once granted EXECUTE.
func Aggregate(ctx context.Context, db database.DBTX, aggregateID string) ([]Row, error) {
	objects, err := queries.ReadInboxOfAggregate(ctx, db, aggregateID)
	return aggregateRows(aggregateID, objects, err)
}

// AggregateSince is Aggregate of the rows first received at since or
// later, for a caller that knows none was received before (an order's
// messages: not before the order). It reads only the time partitions from
// since on (inbox_rows_of_aggregate_since, the inbox's migration 00006),
// where Aggregate probes every one.
func AggregateSince(ctx context.Context, db database.DBTX, aggregateID string, since time.Time) ([]Row, error) {
	objects, err := queries.ReadInboxOfAggregateSince(ctx, db, dbsqlc.ReadInboxOfAggregateSinceParams{AggregateID: aggregateID, Since: since})
	return aggregateRows(aggregateID, objects, err)
}

func aggregateRows(aggregateID string, objects [][]byte, err error) ([]Row, error) {
	if err != nil {
		return nil, fmt.Errorf("inbox rows of %s: %w", aggregateID, database.Translate(err))
	}
	out := make([]Row, len(objects))
	for i, o := range objects {
		if err := json.Unmarshal(o, &out[i]); err != nil { // NULL columns stay ""
			return nil, fmt.Errorf("inbox rows of %s: %w", aggregateID, err)
		}
	}
	slices.SortFunc(out, func(a, b Row) int {
		return cmp.Or(a.FirstReceivedAt.Compare(b.FirstReceivedAt), strings.Compare(a.Consumer, b.Consumer), strings.Compare(a.MessageID, b.MessageID))
	})
	return out, nil
}

// Unprocessed returns up to limit rows that are not PROCESSED, the first
// received first: what may need an operator's look.
func Unprocessed(ctx context.Context, db database.DBTX, limit int) ([]Row, error) {
	rows, err := queries.ReadUnprocessedInbox(ctx, db, int32(limit))
	if err != nil {
		return nil, fmt.Errorf("read inbox rows not PROCESSED: %w", database.Translate(err))
	}
	return rowsOf(rows), nil
}

func rowsOf(rows []dbsqlc.MessageInbox) []Row {
	out := make([]Row, len(rows))
	for i, r := range rows {
		out[i] = rowOf(r)
	}
	return out
}

func rowOf(r dbsqlc.MessageInbox) Row {
	return Row{
		Consumer: r.ConsumerName, MessageID: r.MessageID, Type: r.MessageType, Version: int(r.MessageVersion),
		AggregateID: database.Deref(r.AggregateID), Status: r.Status, Outcome: database.Deref(r.Outcome),
		OutcomeReason: database.Deref(r.OutcomeReason), Attempts: int(r.AttemptCount), PayloadHash: r.PayloadHash,
		FirstReceivedAt: r.FirstReceivedAt, LastReceivedAt: r.LastReceivedAt,
		ProcessingStartedAt: r.ProcessingStartedAt, ProcessedAt: r.ProcessedAt,
		LastErrorCode: database.Deref(r.LastErrorCode), LastErrorMessage: database.Deref(r.LastErrorMessage),
		CorrelationID: database.Deref(r.CorrelationID), CausationID: database.Deref(r.CausationID), TraceID: database.Deref(r.TraceID),
	}
}

// Stat counts the rows of one consumer in one status (not PROCESSED).
type Stat struct {
	Consumer, Status string
	Rows             int64
	OldestAge        time.Duration // since the oldest one's first delivery
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

// TimePartition is one time partition of message_inbox as retention sees
// it (inbox.CreateTimePartitions makes them).
type TimePartition struct {
	Name string    `json:"partition"`
	Ends time.Time `json:"ends"` // its rows were first received before
	// PastRetention: it ended retention or longer ago. Retention drops it
	// once HeldRows is 0: its rows not PROCESSED, or processed within
	// retention.
	PastRetention bool  `json:"past_retention"`
	HeldRows      int64 `json:"held_rows"`
	Dropped       bool  `json:"dropped"`
}

// TimePartitions lists the time partitions, oldest first, as retention
// would find them with retention (0: keep every row forever).
func TimePartitions(ctx context.Context, db database.DBTX, retention time.Duration) ([]TimePartition, error) {
	return timePartitions(ctx, db, retention, false)
}

// DropTimePartitions is the inbox's retention: it detaches and drops every
// time partition past retention whose rows are all PROCESSED, retention
// or longer ago, and lists them all, those it dropped and those it waits
// for. A row is kept for retention at least, and at most retention plus
// one period of its partition.
func DropTimePartitions(ctx context.Context, db database.DBTX, retention time.Duration) ([]TimePartition, error) {
	return timePartitions(ctx, db, retention, true)
}

func timePartitions(ctx context.Context, db database.DBTX, retention time.Duration, drop bool) ([]TimePartition, error) {
	rows, err := queries.TimePartitions(ctx, db, dbsqlc.TimePartitionsParams{RetentionSeconds: retention.Seconds(), DropHeldNone: drop})
	if err != nil {
		return nil, fmt.Errorf("the inbox's time partitions: %w", database.Translate(err))
	}
	out := make([]TimePartition, len(rows))
	for i, r := range rows {
		out[i] = TimePartition{Name: r.PartitionName, Ends: r.RangeEnd, PastRetention: r.PastRetention, HeldRows: r.HeldRows, Dropped: r.Dropped}
	}
	return out, nil
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

// Table is what PostgreSQL's statistics say of the inbox's table (its
// tuples, sizes and last vacuum, summed over its partitions): the figures
// the consumers report as gauges.
func Table(ctx context.Context, db tablestats.DB) (tablestats.Table, error) {
	tables, err := tablestats.Tables(ctx, db, inbox.TableName)
	if err != nil {
		return tablestats.Table{}, err
	}
	if len(tables) == 0 {
		return tablestats.Table{}, fmt.Errorf("table statistics: no table %s", inbox.TableName)
	}
	return tables[0], nil
}
