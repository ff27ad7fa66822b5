package inbox

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/yourorg/orders/internal/background"
)

// ordering is what a worker does about the order of its queue's
// deliveries, chosen once when the consumer starts (orderingOf): a pooled
// worker shares its queue with others and sends a failed delivery round
// the retry queues; an ordered worker is the only one of its partition
// and keeps each aggregate's messages in their order, so it retries a
// failure in place and lets nothing of the partition overtake it.
type ordering interface {
	// run takes a batch of valid deliveries through the inbox and settles
	// each.
	run(ctx context.Context, w *worker, batch []*delivery)
	// admit is asked inside a delivery's transaction, before its handler
	// runs, with what the batch's insert did for it; an error fails the
	// delivery.
	admit(ctx context.Context, tx pgx.Tx, w *worker, d *delivery, ins insertion) error
	// holdsBehindParked says whether admit holds a message behind a
	// parked earlier one of its aggregate: then the batch's insert looks
	// for that message of each row it inserts (insertRows).
	holdsBehindParked() bool
	// retry sends a delivery on to its attempt next, once its failure (or
	// the code busy) was recorded.
	retry(w *worker, d *delivery, next int, code, reason string)
	// requeue gives back a delivery that could not be moved on (a retry or
	// parking publish failed).
	requeue(w *worker, d *delivery)
}

// orderingOf is the ordering of a consumer's workers: ordered when its
// messages are spread over partitions (Config.Partitions), pooled else.
func orderingOf(cfg Config) ordering {
	if cfg.Partitions > 0 {
		return ordered{}
	}
	return pooled{}
}

// pooled is the ordering of workers that share a queue: a batch is one
// transaction, and a failed delivery goes round a retry queue while the
// worker takes the next.
type pooled struct{}

func (pooled) run(ctx context.Context, w *worker, batch []*delivery) { w.process(ctx, batch) }

func (pooled) admit(context.Context, pgx.Tx, *worker, *delivery, insertion) error { return nil }

func (pooled) holdsBehindParked() bool { return false }

func (pooled) retry(w *worker, d *delivery, next int, code, reason string) {
	w.retryLater(d, next, code, reason)
}

// requeue waits a moment first, so that a broker that keeps refusing
// costs one redelivery per second, not a hot loop.
func (pooled) requeue(w *worker, d *delivery) {
	background.Sleep(d.ctx, time.Second)
	_ = d.raw.Nack(false, true)
}

// ordered is the ordering of a partition's only worker. It never puts two
// deliveries of one aggregate in one batch, retries a failure in place
// before it takes the next delivery of its partition (a retry queue would
// let the later messages overtake it), records a redelivery before it
// processes it (markRedelivered), and holds a message behind an earlier
// one of its aggregate that left the queue unprocessed.
type ordered struct{}

func (ordered) run(ctx context.Context, w *worker, batch []*delivery) {
	for len(batch) > 0 {
		run := distinctAggregates(batch)
		for _, d := range run {
			if d.raw.Redelivered {
				if err := markRedelivered(ctx, w.pool, d.inboxEntry(w.consumer.name)); err != nil {
					// Its processing meets the same database and says what
					// became of it; this row only matters should the broker
					// dead-letter the message later.
					w.log.WarnContext(d.ctx, "could not record the redelivery", slog.String("error", err.Error()))
				}
			}
		}
		w.process(ctx, run)
		for _, d := range run {
			if !w.retryInPlace(ctx, d) {
				return // the session ended: the rest come again, after d
			}
		}
		batch = batch[len(run):]
	}
}

// admit holds a message behind a parked earlier one of its aggregate: both
// are replayed together, in order, once its cause is fixed. A first
// delivery (the common case) has the answer from the batch's insert; a
// message seen before looks it up.
func (ordered) admit(ctx context.Context, tx pgx.Tx, w *worker, d *delivery, ins insertion) error {
	parked := ins.EarlierParked
	if !ins.Inserted {
		var err error
		if parked, err = earlierParked(ctx, tx, d.inboxEntry(w.consumer.name)); err != nil {
			return err
		}
	}
	if parked != "" {
		return Permanent("held_behind", fmt.Errorf("message %s of aggregate %s is parked: this one waits behind it, "+
			"to be replayed after it (or after it is discarded)", parked, d.AggregateID()))
	}
	return nil
}

func (ordered) holdsBehindParked() bool { return true }

// retry asks for the delivery to be tried again in place, after the delay
// its retry queue would have (retryInPlace), holding the partition.
func (ordered) retry(w *worker, d *delivery, next int, code, reason string) {
	d.retryIn = w.retryDelay(next - 1)
	d.Attempt = next - 1 // retryInPlace counts the next attempt
	w.log.WarnContext(d.ctx, "retrying in place, holding the partition", slog.String("outcome", "retried"),
		slog.String("reason_code", code), slog.String("reason", reason), slog.Int("next_attempt", next),
		slog.Duration("retry_in", d.retryIn))
}

// requeue tries the delivery again in place: the worker holds the later
// deliveries of its partition in its buffer, and a requeued one would come
// back behind them.
func (ordered) requeue(_ *worker, d *delivery) {
	d.retryIn = time.Second
	d.Attempt-- // moving it on failed; its attempt did not end
}

// distinctAggregates is the longest head of batch with no two deliveries
// of one aggregate.
func distinctAggregates(batch []*delivery) []*delivery {
	seen := map[string]bool{}
	for i, d := range batch {
		if seen[d.AggregateID()] {
			return batch[:i]
		}
		seen[d.AggregateID()] = true
	}
	return batch
}
