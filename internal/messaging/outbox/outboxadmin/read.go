// Package outboxadmin is the outbox's table as operators, tools and pages
// see it: one aggregate's messages, the FAILED and the stuck ones, counts
// by status, one row as the relay publishes it, and the repairs (retry the
// FAILED, drop the time partitions past their retention). The rest of the code
// reads message_outbox through it (queries/read.sql of package outbox),
// never with SQL of its own, so a change of the table changes these
// functions alone. Each takes the caller's DBTX: a pool, or a transaction.
//
// A team that runs the outbox without these tools deletes this folder.
package outboxadmin

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/messaging/outbox"
	"github.com/yourorg/orders/internal/messaging/outbox/dbsqlc"
	"github.com/yourorg/orders/internal/messaging/tablestats"
)

var queries = dbsqlc.New()

// Message is what the read API shows of an outbox row: never its payload,
// routing or claim.
type Message struct {
	ID            uuid.UUID  `json:"outbox_id"` // the AMQP message_id
	AggregateID   string     `json:"aggregate_id"`
	Type          string     `json:"message_type"`
	Status        string     `json:"status"` // PENDING, PUBLISHING, PUBLISHED or FAILED
	Attempts      int        `json:"attempt_count"`
	Producer      string     `json:"producer"`       // the process that wrote it (app_id)
	CorrelationID string     `json:"correlation_id"` // from its headers, as CausationID
	CausationID   string     `json:"causation_id"`   // the message whose handling wrote it; "" for a request
	TraceID       string     `json:"trace_id"`       // from its traceparent header; "" when none
	CreatedAt     time.Time  `json:"created_at"`
	UpdatedAt     time.Time  `json:"updated_at"` // a FAILED row's: when it failed
	NextAttemptAt time.Time  `json:"next_attempt_at"`
	PublishedAt   *time.Time `json:"published_at"`
	LastError     string     `json:"last_error"`
}

// Aggregate returns the messages of one aggregate, oldest first. It reads
// through outbox_messages_of_aggregate (the outbox's migration 00007), so
// a role without SELECT on the table may call it once granted EXECUTE.
func Aggregate(ctx context.Context, db database.DBTX, aggregateType, aggregateID string) ([]Message, error) {
	objects, err := queries.ReadOutboxOfAggregate(ctx, db, dbsqlc.ReadOutboxOfAggregateParams{AggregateType: aggregateType, AggregateID: aggregateID})
	return aggregateMessages(aggregateType, aggregateID, objects, err)
}

// AggregateSince is Aggregate of the messages written at since or later,
// for a caller that knows none was written before (an order's messages:
// not before the order). It reads only the time partitions from since on
// (outbox_messages_of_aggregate_since, the outbox's migration 00013),
// where Aggregate probes every one.
func AggregateSince(ctx context.Context, db database.DBTX, aggregateType, aggregateID string, since time.Time) ([]Message, error) {
	objects, err := queries.ReadOutboxOfAggregateSince(ctx, db, dbsqlc.ReadOutboxOfAggregateSinceParams{
		AggregateType: aggregateType, AggregateID: aggregateID, Since: since})
	return aggregateMessages(aggregateType, aggregateID, objects, err)
}

func aggregateMessages(aggregateType, aggregateID string, objects [][]byte, err error) ([]Message, error) {
	if err != nil {
		return nil, fmt.Errorf("outbox rows of %s %s: %w", aggregateType, aggregateID, database.Translate(err))
	}
	out := make([]Message, len(objects))
	for i, o := range objects {
		var row struct {
			Message
			Traceparent string `json:"traceparent"`
		}
		if err := json.Unmarshal(o, &row); err != nil {
			return nil, fmt.Errorf("outbox rows of %s %s: %w", aggregateType, aggregateID, err)
		}
		out[i] = row.Message
		out[i].TraceID = traceID(row.Traceparent)
	}
	slices.SortFunc(out, func(a, b Message) int {
		return cmp.Or(a.CreatedAt.Compare(b.CreatedAt), slices.Compare(a.ID[:], b.ID[:]))
	})
	return out, nil
}

// Get reads the row of message id as the relay publishes it (outbox.Publishing),
// payload and all, for a tool that publishes it again. Partition is -1:
// the relay's partitioning is not the table's.
func Get(ctx context.Context, db database.DBTX, id uuid.UUID) (outbox.Row, error) {
	r, err := queries.ReadOutboxRow(ctx, db, id)
	if err != nil {
		return outbox.Row{}, fmt.Errorf("outbox row %s: %w", id, database.Translate(err))
	}
	headers := map[string]string{}
	if err := json.Unmarshal(r.Headers, &headers); err != nil {
		headers = map[string]string{} // not an object of strings: a hand-made row, published without them (claimRows)
	}
	return outbox.Row{ID: r.OutboxID, AggregateID: r.AggregateID, Type: r.MessageType, Version: int(r.MessageVersion),
		Exchange: r.ExchangeName, RoutingKey: r.RoutingKey, Payload: r.Payload, Headers: headers,
		Attempt: int(r.AttemptCount), CreatedAt: r.CreatedAt, Partition: -1}, nil
}

// Failed returns up to limit FAILED messages, of messageType or of every
// type (""), the earliest failed first.
func Failed(ctx context.Context, db database.DBTX, messageType string, limit int) ([]Message, error) {
	rows, err := queries.ReadFailedOutbox(ctx, db, dbsqlc.ReadFailedOutboxParams{MessageType: database.NilIfEmpty(messageType), MaxRows: int32(limit)})
	if err != nil {
		return nil, fmt.Errorf("read FAILED outbox rows: %w", database.Translate(err))
	}
	return messages(rows), nil
}

// Stuck returns what needs an operator's look: up to limit FAILED
// messages, the earliest failed first, then up to limit PENDING and limit
// PUBLISHING messages written more than olderThan ago, oldest first.
func Stuck(ctx context.Context, db database.DBTX, olderThan time.Duration, limit int) ([]Message, error) {
	rows, err := queries.ReadStuckOutbox(ctx, db, dbsqlc.ReadStuckOutboxParams{MaxRows: int32(limit), OlderThanSeconds: olderThan.Seconds()})
	if err != nil {
		return nil, fmt.Errorf("read stuck outbox rows: %w", database.Translate(err))
	}
	return messages(rows), nil
}

// RetryFailed sends FAILED rows back to PENDING, due now and with their
// attempts reset, and returns them as they are now: the rows of ids, or
// with messageType set, every FAILED row of that type. Rows that are not
// FAILED are left alone. It is an operator's repair after the cause is
// fixed (orderctl outbox retry); LastError still says why the last
// publish failed.
func RetryFailed(ctx context.Context, db database.DBTX, ids []uuid.UUID, messageType string) ([]Message, error) {
	rows, err := queries.RetryFailedOutbox(ctx, db, dbsqlc.RetryFailedOutboxParams{
		OutboxIds: ids, MessageType: database.NilIfEmpty(messageType),
	})
	if err != nil {
		return nil, fmt.Errorf("retry failed outbox rows: %w", database.Translate(err))
	}
	return messages(rows), nil
}

// messageRow is sqlc's row type of each query of read.sql that returns
// messages: each has the columns of ReadFailedOutbox, in its order, so it
// converts to that type (and the compiler says so).
type messageRow interface {
	dbsqlc.ReadFailedOutboxRow | dbsqlc.ReadStuckOutboxRow | dbsqlc.RetryFailedOutboxRow
}

func messages[R messageRow](rows []R) []Message {
	out := make([]Message, len(rows))
	for i, row := range rows {
		r := dbsqlc.ReadFailedOutboxRow(row)
		out[i] = Message{
			ID: r.OutboxID, AggregateID: r.AggregateID, Type: r.MessageType, Status: r.Status, Attempts: int(r.AttemptCount),
			Producer: r.Producer, CorrelationID: r.CorrelationID, CausationID: r.CausationID, TraceID: traceID(r.Traceparent),
			CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt, NextAttemptAt: r.NextAttemptAt, PublishedAt: r.PublishedAt, LastError: r.LastError,
		}
	}
	return out
}

// traceID returns the trace id of a W3C traceparent
// ("00-<trace id>-<span id>-<flags>"), or "" when it is not one.
func traceID(traceparent string) string {
	parts := strings.Split(traceparent, "-")
	if len(parts) != 4 || len(parts[1]) != 32 || parts[1] == strings.Repeat("0", 32) {
		return ""
	}
	return parts[1]
}

// Stat is the count of rows of one status and type.
type Stat struct {
	Status      string
	MessageType string
	Rows        int64
	// OldestAge is the age of the oldest row (PENDING only): how long the
	// oldest waiting message has waited.
	OldestAge time.Duration
}

// Stats counts the PENDING, PUBLISHING and FAILED rows by type.
func Stats(ctx context.Context, db database.DBTX) ([]Stat, error) {
	rows, err := queries.OutboxStats(ctx, db)
	if err != nil {
		return nil, fmt.Errorf("outbox stats: %w", database.Translate(err))
	}
	out := make([]Stat, len(rows))
	for i, r := range rows {
		out[i] = Stat{Status: r.Status, MessageType: r.MessageType, Rows: r.RowCount,
			OldestAge: time.Duration(r.OldestAgeSeconds * float64(time.Second))}
	}
	return out, nil
}

// TimePartition is one time partition of message_outbox as retention
// sees it (outbox.CreateTimePartitions makes them).
type TimePartition struct {
	Name string    `json:"partition"`
	Ends time.Time `json:"ends"` // its rows were written before
	// PastRetention: it ended retention or longer ago. Retention drops it
	// once HeldRows is 0: its rows not PUBLISHED, or published within
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

// DropTimePartitions is the outbox's retention: it detaches and drops
// every time partition past retention whose rows are all PUBLISHED,
// retention or longer ago, and lists them all, those it dropped and those
// it waits for. A row is kept for retention at least, and at most
// retention plus one period of its partition.
func DropTimePartitions(ctx context.Context, db database.DBTX, retention time.Duration) ([]TimePartition, error) {
	return timePartitions(ctx, db, retention, true)
}

func timePartitions(ctx context.Context, db database.DBTX, retention time.Duration, drop bool) ([]TimePartition, error) {
	rows, err := queries.TimePartitions(ctx, db, dbsqlc.TimePartitionsParams{RetentionSeconds: retention.Seconds(), DropHeldNone: drop})
	if err != nil {
		return nil, fmt.Errorf("the outbox's time partitions: %w", database.Translate(err))
	}
	out := make([]TimePartition, len(rows))
	for i, r := range rows {
		out[i] = TimePartition{Name: r.PartitionName, Ends: r.RangeEnd, PastRetention: r.PastRetention, HeldRows: r.HeldRows, Dropped: r.Dropped}
	}
	return out, nil
}

// Table is what PostgreSQL's statistics say of the outbox's table (its
// tuples, sizes and last vacuum, summed over its partitions): the figures
// the relay report as gauges.
func Table(ctx context.Context, db tablestats.DB) (tablestats.Table, error) {
	tables, err := tablestats.Tables(ctx, db, outbox.TableName)
	if err != nil {
		return tablestats.Table{}, err
	}
	if len(tables) == 0 {
		return tablestats.Table{}, fmt.Errorf("table statistics: no table %s", outbox.TableName)
	}
	return tables[0], nil
}
