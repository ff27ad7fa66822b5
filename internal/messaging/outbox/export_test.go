package outbox

import (
	"context"
	"time"

	"github.com/google/uuid"

	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/messaging/outbox/internal/pipeline"
)

// The pipeline's types, under the names the tests use.
type (
	Claim          = pipeline.Claim
	PublishFailure = pipeline.PublishFailure
	Marks          = pipeline.Marks
	Marked         = pipeline.Marked
	Outcome        = pipeline.Outcome
)

// The statements' test seams: the relay's claim and marks, called one by
// one (rows_test.go, read_test.go, BenchmarkRelayThroughput).

// ClaimRows is claimRows of the whole outbox.
func ClaimRows(ctx context.Context, db database.DBTX, claimer string, limit int, lease time.Duration) ([]Row, error) {
	return claimRows(ctx, db, newClaimToken(claimer), limit, lease, claimScope{})
}

// ClaimRowsBefore is claimRows of the log-tailing relay's sweep
// (Relay.ClaimOnlyBefore): rows written before cutoff, or whose last
// publish failed.
func ClaimRowsBefore(ctx context.Context, db database.DBTX, claimer string, limit int, lease time.Duration, cutoff time.Time) ([]Row, error) {
	return claimRows(ctx, db, newClaimToken(claimer), limit, lease, claimScope{sweep: true, sweepReady: true, before: cutoff})
}

// Mark is markRows.
func Mark(ctx context.Context, db database.DBTX, m Marks, maxAttempts int) (Marked, error) {
	return markRows(ctx, db, m, maxAttempts)
}

// MarkPublished marks the confirmed rows PUBLISHED and says how many.
func MarkPublished(ctx context.Context, db database.DBTX, claims []Claim) (int64, error) {
	m, err := markRows(ctx, db, Marks{Published: claims}, 0)
	return m.Published, err
}

// MarkFailed marks returned rows and says which became FAILED.
func MarkFailed(ctx context.Context, db database.DBTX, failures []PublishFailure, maxAttempts int) ([]uuid.UUID, error) {
	m, err := markRows(ctx, db, Marks{Refused: failures}, maxAttempts)
	return m.Failed, err
}

// ReleaseClaims hands claimed rows back and says how many.
func ReleaseClaims(ctx context.Context, db database.DBTX, releases []PublishFailure) (int64, error) {
	m, err := markRows(ctx, db, Marks{Released: releases}, 0)
	return m.Released, err
}

// RecoverExpiredClaims is recoverExpiredClaims of every lease that ran out.
func RecoverExpiredClaims(ctx context.Context, db database.DBTX) ([]uuid.UUID, error) {
	return recoverExpiredClaims(ctx, db, 0)
}

// Notifications counts the NOTIFYs the relay heard: those that woke its
// claim loop, those of rows of partitions it does not hold, and those
// whose rows wait behind rows it has in flight (their mark wakes it).
func (r *Relay) Notifications() (woken, ignored, deferred int64) {
	return r.wakeups.woken.Load(), r.wakeups.ignored.Load(), r.wakeups.deferred.Load()
}

// HeldPartitions are the partitions the relay holds.
func (r *Relay) HeldPartitions() []int32 {
	if p := r.partitions.Load(); p != nil {
		return *p
	}
	return nil
}

// ParseNotifyPayload is parseNotifyPayload.
var ParseNotifyPayload = parseNotifyPayload
