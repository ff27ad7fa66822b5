// Package inboxtest writes inbox rows in a given state, for the tests of
// packages that read them (an order's timeline, say) and have no broker to
// deliver a message through a consumer. It writes with the inbox's own
// statements, so a row it writes is one a consumer could have written.
// Production code never imports it.
package inboxtest

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/messaging/inbox"
	"github.com/yourorg/orders/internal/messaging/inbox/dbsqlc"
	"github.com/yourorg/orders/internal/messaging/outbox"
)

// Message is a message as a consumer's inbox records it.
type Message struct {
	Consumer, MessageID, Type string
	Version                   int
	AggregateID               string
	CorrelationID, TraceID    string
}

var queries = dbsqlc.New()

// Applied writes the row of m as a consumer leaves it when it applied the
// message: PROCESSED (APPLIED), in tx, beside the effect.
func Applied(ctx context.Context, tx database.DBTX, m Message) error {
	ids, err := queries.InsertInboxRows(ctx, tx, dbsqlc.InsertInboxRowsParams{
		ConsumerName: m.Consumer, MessageIds: []string{m.MessageID}, MessageTypes: []string{m.Type},
		MessageVersions: []int32{int32(m.Version)}, AggregateIds: []string{m.AggregateID}, PayloadHashes: []string{"inboxtest"},
		CorrelationIds: []string{m.CorrelationID}, CausationIds: []string{""}, TraceIds: []string{m.TraceID},
	})
	if err != nil {
		return fmt.Errorf("write the applied inbox row of %s: %w", m.MessageID, err)
	}
	if len(ids) != 1 {
		return fmt.Errorf("write the applied inbox row of %s: the consumer %s has it already", m.MessageID, m.Consumer)
	}
	return nil
}

// Failed writes the row of m as a consumer leaves it after a failed
// attempt: RETRYABLE_FAILED with the error code and message.
func Failed(ctx context.Context, db database.DBTX, m Message, code, message string) error {
	_, err := queries.RecordInboxFailure(ctx, db, dbsqlc.RecordInboxFailureParams{
		ConsumerName: m.Consumer, MessageID: m.MessageID, MessageType: m.Type, MessageVersion: int32(m.Version),
		AggregateID: database.NilIfEmpty(m.AggregateID), Status: inbox.StatusRetryableFailed, PayloadHash: "inboxtest",
		LastErrorCode: &code, LastErrorMessage: &message,
		CorrelationID: database.NilIfEmpty(m.CorrelationID), TraceID: database.NilIfEmpty(m.TraceID),
	})
	if err != nil {
		return fmt.Errorf("write the failed inbox row of %s: %w", m.MessageID, err)
	}
	return nil
}

// TimePartitionsFrom lays a new database's message_inbox out as if the
// consumers had made its weekly time partitions since start: the initial
// partition ends at start, and weeks follow up to the horizon, so that
// rows first received earlier land in partitions retention may drop. The
// table must be empty; db must own it (a test's own pool).
func TimePartitionsFrom(ctx context.Context, db *pgxpool.Pool, start time.Time) error {
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		var rows int
		if err := tx.QueryRow(ctx, "SELECT count(*) FROM message_inbox").Scan(&rows); err != nil {
			return err
		}
		if rows != 0 {
			return fmt.Errorf("message_inbox holds %d rows: lay its partitions out first", rows)
		}
		parts, err := tx.Query(ctx, "SELECT partition_name FROM inbox_time_partition_bounds()")
		if err != nil {
			return err
		}
		names, err := pgx.CollectRows(parts, pgx.RowTo[string])
		if err != nil {
			return err
		}
		for _, name := range names {
			if _, err := tx.Exec(ctx, "DROP TABLE "+pgx.Identifier{name}.Sanitize()); err != nil {
				return err
			}
		}
		_, err = tx.Exec(ctx, fmt.Sprintf("CREATE TABLE message_inbox_initial PARTITION OF message_inbox FOR VALUES FROM (MINVALUE) TO ('%s')",
			start.UTC().Format(time.RFC3339)))
		return err
	})
	if err != nil {
		return fmt.Errorf("lay the inbox's time partitions out: %w", err)
	}
	_, err = inbox.CreateTimePartitions(ctx, db, outbox.Week)
	return err
}
