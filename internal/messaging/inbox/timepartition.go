package inbox

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/messaging/inbox/dbsqlc"
	"github.com/yourorg/orders/internal/messaging/outbox"
)

// message_inbox is range-partitioned on first_received_at (migrations
// 00003 and 00004): time partitions of Config.TimePartition, which the
// consumers make ahead (outbox.TimePartitionsAhead periods, as the relays
// do the outbox's) and retention drops whole. A message's row is found in
// whichever partition it is (queries/inbox.sql, LockInboxKeys).

// timePartitionEvery is how often a consumer process makes time
// partitions ahead and, with InboxRetention, drops those past it.
const timePartitionEvery = 15 * time.Minute

// CreateTimePartitions makes the time partitions of message_inbox until
// they reach outbox.TimePartitionsAhead(period) periods past now, and
// returns where the last one ends. Processes call it at once without
// harm.
func CreateTimePartitions(ctx context.Context, db database.DBTX, period string) (time.Time, error) {
	horizon, err := queries.CreateTimePartitions(ctx, db, dbsqlc.CreateTimePartitionsParams{
		Period: period, Ahead: int32(outbox.TimePartitionsAhead(period)),
	})
	if err != nil {
		return time.Time{}, fmt.Errorf("create the inbox's time partitions: %w", database.Translate(err))
	}
	return horizon, nil
}

// maintainTimePartitions makes time partitions ahead and, with
// InboxRetention, drops those retention allows, at start and every
// timePartitionEvery.
func (cs *Consumers) maintainTimePartitions(ctx context.Context) {
	tick := time.NewTicker(timePartitionEvery)
	defer tick.Stop()
	for {
		cs.timePartitionTurn(ctx)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// timePartitionTurn is one turn of maintainTimePartitions.
func (cs *Consumers) timePartitionTurn(ctx context.Context) {
	dbctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	horizon, err := CreateTimePartitions(dbctx, cs.pool, cs.cfg.TimePartition)
	if err != nil && ctx.Err() == nil {
		cs.log.ErrorContext(ctx, "making the inbox's time partitions ahead failed", slog.String("error", err.Error()))
	}
	if err == nil {
		cs.horizon.Store(horizon.Unix())
	}
	period := 7 * 24 * time.Hour
	if cs.cfg.TimePartition == outbox.Day {
		period = 24 * time.Hour
	}
	if h := cs.horizon.Load(); h != 0 && time.Until(time.Unix(h, 0)) < period {
		cs.log.ErrorContext(ctx, "the inbox's last time partition ends within a period: deliveries after it will fail",
			slog.Time("ends", time.Unix(h, 0)))
	}
	if cs.cfg.InboxRetention <= 0 {
		return
	}
	parts, err := queries.TimePartitions(dbctx, cs.pool, dbsqlc.TimePartitionsParams{
		RetentionSeconds: cs.cfg.InboxRetention.Seconds(), DropHeldNone: true,
	})
	if err != nil {
		if ctx.Err() == nil {
			cs.log.WarnContext(ctx, "inbox retention failed; the next turn retries", slog.String("error", database.Translate(err).Error()))
		}
		return
	}
	var held int64
	for _, p := range parts {
		switch {
		case p.Dropped:
			cs.log.InfoContext(ctx, "inbox retention dropped a time partition", slog.String("partition", p.PartitionName),
				slog.Time("ended", p.RangeEnd))
		case p.PastRetention:
			held++
			cs.log.WarnContext(ctx, "inbox retention waits for a time partition's rows not PROCESSED, or processed within it",
				slog.String("partition", p.PartitionName), slog.Int64("rows", p.HeldRows))
		}
	}
	cs.heldPartitions.Store(held)
}
