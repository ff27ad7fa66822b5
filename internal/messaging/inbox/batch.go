package inbox

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"runtime/debug"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/metric"

	"github.com/yourorg/orders/internal/messaging/outbox"
)

// collect adds to batch the deliveries that are already waiting, up to
// BatchSize, and, with BatchWait set, those that arrive within BatchWait.
// It never waits for a first one, so a quiet queue gets no added latency.
// The client hands deliveries over one at a time from a goroutine of its
// own, so "already waiting" means: there after that goroutine has had a
// chance to run (a few yields).
func (c *loop) collect(batch []amqp.Delivery, deliveries <-chan amqp.Delivery, stop <-chan struct{}) []amqp.Delivery {
	var wait <-chan time.Time
	if c.cfg.BatchWait > 0 {
		t := time.NewTimer(c.cfg.BatchWait)
		defer t.Stop()
		wait = t.C
	}
	for misses := 0; len(batch) < c.cfg.BatchSize; {
		select {
		case raw, ok := <-deliveries:
			if !ok {
				return batch
			}
			batch, misses = append(batch, raw), 0
			continue
		default:
		}
		if wait == nil {
			if misses++; misses > 3 {
				return batch
			}
			runtime.Gosched()
			continue
		}
		select {
		case raw, ok := <-deliveries:
			if !ok {
				return batch
			}
			batch = append(batch, raw)
		case <-wait:
			return batch
		case <-stop:
			return batch
		}
	}
	return batch
}

// handleBatch applies several deliveries in one transaction: one commit
// (one WAL flush) for all of them instead of one each, with exactly the
// per-message semantics of handle: an inbox row per message, its
// duplicate check and guard, its follow-up outbox rows, its ack only after
// the commit. When anything in the batch fails, the transaction rolls back
// as a whole and each delivery is applied again on its own, in a
// transaction of its own, so one bad message never takes the others down
// with it.
func (c *loop) handleBatch(ctx context.Context, pub *confirmPublisher, raws []amqp.Delivery) {
	c.metrics.batchSize.Record(ctx, int64(len(raws)), metric.WithAttributes(attrConsumer.String(c.def.name)))
	if len(raws) == 1 {
		c.handle(ctx, pub, raws[0])
		return
	}
	steps := make([]*step, 0, len(raws))
	for _, raw := range raws {
		s := c.begin(ctx, raw)
		defer s.span.End()
		if s.err != nil {
			c.settle(s, pub, result{}, s.err) // an invalid envelope: parked at once
			continue
		}
		steps = append(steps, s)
	}
	if len(steps) == 0 {
		return
	}
	effects, err := c.applyBatch(ctx, steps)
	if err != nil {
		c.log.DebugContext(ctx, "batch rolled back; applying its deliveries one by one",
			slog.Int("deliveries", len(steps)), slog.String("error", err.Error()))
		for _, s := range steps {
			res, err := c.applyHolding(s.ctx, s.d, s.h)
			c.settle(s, pub, res, err)
		}
		return
	}
	for i, s := range steps {
		res, err := c.afterFirstStep(s.ctx, s.d, effects[i])
		c.settle(s, pub, res, err)
	}
}

// applyBatch runs the first step of every delivery of steps in one
// transaction, each statement in the context of its own delivery (its
// trace), under the transaction's deadline. The round trips that do not
// depend on each other are shared: one statement inserts the inbox rows of
// every delivery before the first handler runs, and one writes the
// follow-up messages of all of them just before the commit. Between the
// two, each delivery in turn gets its decision (a row found goes through
// Begin's checks at its turn, after the handlers of the deliveries before
// it, as it would one by one) and its handler's statements.
func (c *loop) applyBatch(ctx context.Context, steps []*step) (effects []effect, err error) {
	defer func() {
		if r := recover(); r != nil {
			c.log.ErrorContext(ctx, "handler panicked in a batch", slog.Any("panic", r), slog.String("stack", string(debug.Stack())))
			err = fmt.Errorf("a handler panicked: %v", r) // the deliveries are applied again one by one
		}
	}()
	entries := make([]Entry, len(steps))
	for i, s := range steps {
		entries[i] = s.d.inboxEntry(c.def.name)
	}
	err = retryTx(ctx, func() error {
		effects = make([]effect, len(steps))
		return c.inTx(ctx, func(txCtx context.Context, tx pgx.Tx) error {
			inserted, err := insertRows(txCtx, tx, c.def.name, entries)
			if err != nil {
				return err
			}
			followUps := outbox.Buffer{Writer: c.outbox}
			deadline, _ := txCtx.Deadline()
			for i, s := range steps {
				row := rowFound
				if inserted[i] {
					row = rowInserted
				}
				sctx, cancel := context.WithDeadline(s.ctx, deadline)
				e, err := c.firstStep(sctx, tx, s.d, s.h, row, &followUps)
				cancel()
				if err != nil {
					return fmt.Errorf("message %s: %w", s.d.MessageID, err)
				}
				effects[i] = e
			}
			return flushFollowUps(txCtx, tx, &followUps)
		})
	})
	return effects, err
}
