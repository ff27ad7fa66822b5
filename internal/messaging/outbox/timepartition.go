package outbox

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/messaging/outbox/dbsqlc"
)

// message_outbox is range-partitioned on created_at (migrations 00008 and
// 00009): its time partitions, one Config.TimePartition each, not to be
// confused with the relays' aggregate partitions (Config.Partitions). The
// relays make them ahead and drop those retention allows; a row whose time
// has no partition is refused, so the relays keep TimePartitionsAhead
// periods made, and say when the last one nears its end.

// Time partition periods (Config.TimePartition).
const (
	Day  = "day"
	Week = "week" // from Monday 00:00 UTC
)

// timePartitionEvery is how often a relay makes time partitions ahead
// and, with Retention, drops those past it.
const timePartitionEvery = 15 * time.Minute

// TimePartitionsAhead is how many periods ahead of now the relays keep
// time partitions made: two weeks of days, or four weeks.
func TimePartitionsAhead(period string) int {
	if period == Day {
		return 14
	}
	return 4
}

// periodLength is one period of a time partition.
func periodLength(period string) time.Duration {
	if period == Day {
		return 24 * time.Hour
	}
	return 7 * 24 * time.Hour
}

// CreateTimePartitions makes the time partitions of message_outbox until
// they reach TimePartitionsAhead(period) periods past now, and returns
// where the last one ends. Relays call it at once without harm.
func CreateTimePartitions(ctx context.Context, db database.DBTX, period string) (time.Time, error) {
	horizon, err := queries.CreateTimePartitions(ctx, db, dbsqlc.CreateTimePartitionsParams{
		Period: period, Ahead: int32(TimePartitionsAhead(period)),
	})
	if err != nil {
		return time.Time{}, fmt.Errorf("create the outbox's time partitions: %w", database.Translate(err))
	}
	return horizon, nil
}

// maintainTimePartitions makes time partitions ahead and, with Retention,
// drops those retention allows, at start and every timePartitionEvery.
func (r *Relay) maintainTimePartitions(ctx context.Context) {
	tick := time.NewTicker(timePartitionEvery)
	defer tick.Stop()
	for {
		r.timePartitionTurn(ctx)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// timePartitionTurn is one turn of maintainTimePartitions.
func (r *Relay) timePartitionTurn(ctx context.Context) {
	dbctx, cancel := context.WithTimeout(ctx, r.cfg.DBTimeout)
	defer cancel()
	horizon, err := CreateTimePartitions(dbctx, r.pool, r.cfg.TimePartition)
	if err != nil && ctx.Err() == nil {
		r.log.ErrorContext(ctx, "making the outbox's time partitions ahead failed", slog.String("error", err.Error()))
	}
	if err == nil {
		r.horizon.Store(horizon.Unix())
	}
	if h := r.horizon.Load(); h != 0 && time.Until(time.Unix(h, 0)) < periodLength(r.cfg.TimePartition) {
		r.log.ErrorContext(ctx, "the outbox's last time partition ends within a period: messages written after it will be refused",
			slog.Time("ends", time.Unix(h, 0)))
	}
	if r.cfg.Retention <= 0 {
		return
	}
	parts, err := queries.TimePartitions(dbctx, r.pool, dbsqlc.TimePartitionsParams{
		RetentionSeconds: r.cfg.Retention.Seconds(), DropHeldNone: true,
	})
	if err != nil {
		if ctx.Err() == nil {
			r.log.WarnContext(ctx, "outbox retention failed; the next turn retries", slog.String("error", database.Translate(err).Error()))
		}
		return
	}
	var held int64
	for _, p := range parts {
		switch {
		case p.Dropped:
			r.log.InfoContext(ctx, "outbox retention dropped a time partition", slog.String("partition", p.PartitionName),
				slog.Time("ended", p.RangeEnd))
		case p.PastRetention:
			held++
			r.log.WarnContext(ctx, "outbox retention waits for a time partition's unfinished rows", slog.String("partition", p.PartitionName),
				slog.Int64("rows", p.HeldRows))
		}
	}
	r.heldPartitions.Store(held)
}
