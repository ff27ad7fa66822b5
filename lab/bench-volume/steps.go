package main

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	inboxsql "github.com/yourorg/orders/internal/messaging/inbox/dbsqlc"
	"github.com/yourorg/orders/internal/messaging/inbox/inboxadmin"
	outboxsql "github.com/yourorg/orders/internal/messaging/outbox/dbsqlc"
	"github.com/yourorg/orders/internal/messaging/outbox/outboxadmin"
	walsql "github.com/yourorg/orders/internal/messaging/outbox/wal/dbsqlc"
	"github.com/yourorg/orders/internal/messaging/tablestats"
	"github.com/yourorg/orders/internal/timeline"
)

// step is one hot path: prepare makes what it needs (outside the timing),
// run is timed.
type step struct {
	name    string
	prepare func(ctx context.Context, db *volumeDB) (any, error)
	run     func(ctx context.Context, db *volumeDB, prepared any) error
}

// batchSize is a relay's batch (RELAY_BATCH_SIZE's default); consumerBatch
// a consumer's.
const (
	batchSize     = 100
	consumerBatch = 50
	retention     = 30 * 24 * time.Hour
)

var steps = []step{
	{name: "poll claim+mark", prepare: writeDue, run: claimAndMark},
	{name: "wal write-back", prepare: writeDue, run: writeBack},
	{name: "consumer batch", prepare: newMessages, run: consumeBatch},
	{name: "order timeline", run: readTimeline},
	{name: "orderctl status", run: status},
	{name: "retention", run: retentionTurn},
}

// due is a batch of PENDING rows writeDue wrote.
type due struct {
	ids     []uuid.UUID
	created []time.Time
}

// writeDue writes a batch of PENDING outbox rows, each of an aggregate of
// its own, as order-api would now.
func writeDue(ctx context.Context, db *volumeDB) (any, error) {
	rows, err := db.pool.Query(ctx, `
		INSERT INTO message_outbox (outbox_id, aggregate_type, aggregate_id, message_type, message_version, exchange_name, routing_key, payload)
		SELECT gen_random_uuid(), 'order', gen_random_uuid()::text, 'order.volume', 1, 'orders', 'order.volume', '{}'
		FROM generate_series(1, $1::integer)
		RETURNING outbox_id, created_at`, batchSize)
	if err != nil {
		return nil, err
	}
	var d due
	for rows.Next() {
		var id uuid.UUID
		var at time.Time
		if err := rows.Scan(&id, &at); err != nil {
			return nil, err
		}
		d.ids, d.created = append(d.ids, id), append(d.created, at)
	}
	return d, rows.Err()
}

var (
	outboxQueries = outboxsql.New()
	walQueries    = walsql.New()
	inboxQueries  = inboxsql.New()
)

// claimAndMark is the polling relay's hot path: a claim of a batch, then
// its mark once the broker confirmed every row.
func claimAndMark(ctx context.Context, db *volumeDB, _ any) error {
	token := "bench-volume/" + uuid.NewString()
	rows, err := outboxQueries.ClaimOutbox(ctx, db.pool, outboxsql.ClaimOutboxParams{
		Claimer: &token, LeaseSeconds: 30, HeldTypes: []string{}, MaxRows: batchSize,
	})
	if err != nil {
		return err
	}
	if len(rows) != batchSize {
		return fmt.Errorf("claimed %d rows, want %d", len(rows), batchSize)
	}
	p := outboxsql.MarkOutboxParams{MaxAttempts: 10, Oldest: rows[0].CreatedAt, Newest: rows[0].CreatedAt}
	for _, r := range rows {
		p.PublishedIds = append(p.PublishedIds, r.OutboxID)
		p.PublishedCreated = append(p.PublishedCreated, r.CreatedAt)
		p.PublishedTokens = append(p.PublishedTokens, token)
		p.Oldest, p.Newest = minTime(p.Oldest, r.CreatedAt), maxTime(p.Newest, r.CreatedAt)
	}
	marked, err := outboxQueries.MarkOutbox(ctx, db.pool, p)
	if err == nil && marked.Published != batchSize {
		err = fmt.Errorf("marked %d rows, want %d", marked.Published, batchSize)
	}
	return err
}

// writeBack is the log-tailing relay's hot path: the write-back of a
// batch it streamed and the broker confirmed.
func writeBack(ctx context.Context, db *volumeDB, prepared any) error {
	d := prepared.(due)
	p := walsql.MarkStreamedParams{MaxAttempts: 10, PublishedIds: d.ids, PublishedCreated: d.created,
		Oldest: d.created[0], Newest: d.created[len(d.created)-1]}
	marked, err := walQueries.MarkStreamed(ctx, db.pool, p)
	if err == nil && marked.Published != int64(len(d.ids)) {
		err = fmt.Errorf("wrote back %d rows, want %d", marked.Published, len(d.ids))
	}
	return err
}

// newMessages are the ids of a consumer's batch of messages never seen.
func newMessages(context.Context, *volumeDB) (any, error) {
	ids := make([]string, consumerBatch)
	for i := range ids {
		ids[i] = uuid.NewString()
	}
	return ids, nil
}

// consumeBatch is a consumer's hot path: a batch's deduplication and inbox
// rows, in the transaction that would apply its effects.
func consumeBatch(ctx context.Context, db *volumeDB, prepared any) error {
	ids := prepared.([]string)
	p := inboxsql.InsertInboxRowsParams{ConsumerName: "consumer-1", MessageIds: ids}
	for range ids {
		p.MessageTypes = append(p.MessageTypes, "order.volume")
		p.MessageVersions = append(p.MessageVersions, 1)
		p.AggregateIds = append(p.AggregateIds, uuid.NewString())
		p.PayloadHashes = append(p.PayloadHashes, "hash")
		p.CorrelationIds = append(p.CorrelationIds, "")
		p.CausationIds = append(p.CausationIds, "")
		p.TraceIds = append(p.TraceIds, "")
	}
	return pgx.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error {
		if err := inboxQueries.LockInboxKeys(ctx, tx, inboxsql.LockInboxKeysParams{ConsumerName: p.ConsumerName, MessageIds: ids}); err != nil {
			return err
		}
		inserted, err := inboxQueries.InsertInboxRows(ctx, tx, p)
		if err == nil && len(inserted) != len(ids) {
			err = fmt.Errorf("inserted %d inbox rows, want %d", len(inserted), len(ids))
		}
		return err
	})
}

// readTimeline is what GET /v1/orders/{id} reads.
func readTimeline(ctx context.Context, db *volumeDB, _ any) error {
	return pgx.BeginTxFunc(ctx, db.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		tl, err := timeline.Read(ctx, tx, db.order)
		if err == nil && (len(tl.Outbox) != 5 || len(tl.Inbox) != 5) {
			err = fmt.Errorf("order %s: %d outbox and %d inbox rows, want 5 each", db.order, len(tl.Outbox), len(tl.Inbox))
		}
		return err
	})
}

// status is the database's part of orderctl status.
func status(ctx context.Context, db *volumeDB, _ any) error {
	if _, err := outboxadmin.Stats(ctx, db.pool); err != nil {
		return err
	}
	if _, err := inboxadmin.Stats(ctx, db.pool); err != nil {
		return err
	}
	if _, err := outboxadmin.Table(ctx, db.pool); err != nil {
		return err
	}
	if _, err := inboxadmin.Table(ctx, db.pool); err != nil {
		return err
	}
	if _, err := outboxadmin.Stuck(ctx, db.pool, 5*time.Minute, 5); err != nil {
		return err
	}
	_, err := tablestats.Horizon(ctx, db.pool)
	return err
}

// retentionTurn is the relays' and consumers' retention turn, without the
// drop: every partition, and the rows that hold those past retention.
func retentionTurn(ctx context.Context, db *volumeDB, _ any) error {
	if _, err := outboxadmin.TimePartitions(ctx, db.pool, retention); err != nil {
		return err
	}
	_, err := inboxadmin.TimePartitions(ctx, db.pool, retention)
	return err
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
