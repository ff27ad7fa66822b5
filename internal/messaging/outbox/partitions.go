package outbox

import (
	"context"
	"log/slog"
	"slices"

	"github.com/yourorg/orders/internal/messaging/outbox/dbsqlc"
	"github.com/yourorg/orders/internal/messaging/outbox/internal/pipeline"
)

// MaxPartitions bounds Config.Partitions.
const MaxPartitions = 1024

// HeaderPartition is the AMQP header that carries a message's partition
// when the relays share the outbox by partition (Config.Partitions).
const HeaderPartition = pipeline.HeaderPartition

// leasePartitions renews this relay's partition leases and takes or gives
// back partitions toward its fair share (the LeasePartitions query), and
// keeps what it holds for the claim loop. On failure it keeps what it had:
// the leases run on, and a claim only ever reads rows of partitions the
// relay held when it looked.
func (r *Relay) leasePartitions(ctx context.Context) {
	if r.cfg.Partitions == 0 {
		return
	}
	if r.everyPartition {
		if r.partitions.Load() == nil {
			all := make([]int32, r.cfg.Partitions)
			for i := range all {
				all[i] = int32(i)
			}
			r.partitions.Store(&all)
		}
		return
	}
	ctx, cancel := context.WithTimeout(ctx, r.cfg.DBTimeout)
	defer cancel()
	if !r.partitionRows.Load() {
		if err := queries.EnsurePartitions(ctx, r.pool, int32(r.cfg.Partitions-1)); err != nil {
			r.log.WarnContext(ctx, "making the partition lease rows failed", slog.String("error", err.Error()))
			return
		}
		r.partitionRows.Store(true)
	}
	id := r.cfg.ID
	mine, err := queries.LeasePartitions(ctx, r.pool, dbsqlc.LeasePartitionsParams{
		LeaseSeconds: r.cfg.Lease.Seconds(), Owner: id, Partitions: int32(r.cfg.Partitions),
	})
	if err != nil {
		if ctx.Err() == nil {
			r.log.WarnContext(ctx, "renewing the partition leases failed; keeping those held", slog.String("error", err.Error()))
		}
		return
	}
	before := r.partitions.Swap(&mine)
	if before == nil || !slices.Equal(*before, mine) {
		r.log.InfoContext(ctx, "partitions held", slog.Any("partitions", mine), slog.Int("of", r.cfg.Partitions))
		r.signal() // new partitions may have rows waiting
	}
}

// releasePartitions gives this relay's partitions back as it stops, so
// that the others take them at once instead of after the lease.
func (r *Relay) releasePartitions(ctx context.Context) {
	if r.cfg.Partitions == 0 || r.everyPartition {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.DBTimeout)
	defer cancel()
	id := r.cfg.ID
	if err := queries.ReleasePartitions(ctx, r.pool, &id); err != nil {
		r.log.WarnContext(ctx, "giving the partitions back failed; they pass to others when the leases end", slog.String("error", err.Error()))
	}
	r.partitions.Store(nil)
}

// scope is what the claim loop may claim now.
func (r *Relay) scope() claimScope {
	s := claimScope{held: r.readers.Load().held(), partitions: r.cfg.Partitions}
	if p := r.partitions.Load(); p != nil {
		s.mine = *p
	}
	if r.sweepCutoff != nil { // ClaimOnlyBefore
		s.sweep = true
		s.before, s.sweepReady = r.sweepCutoff()
	}
	return s
}

// claimsNothing reports whether the relay may claim nothing now: it holds
// no partition while the outbox is partitioned, or its cutoff
// (ClaimOnlyBefore) says claim nothing.
func (s claimScope) claimsNothing() bool {
	return (s.partitions > 0 && len(s.mine) == 0) || (s.sweep && !s.sweepReady)
}
