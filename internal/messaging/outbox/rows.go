package outbox

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"

	"github.com/yourorg/orders/internal/messaging/outbox/dbsqlc"
	"github.com/yourorg/orders/internal/store"
)

// The relay's side of the outbox table: claim rows, then mark each one by
// what the broker said. See docs/state-machines.md for the row's life cycle.

// Row is a claimed outbox row: a message to publish.
type Row struct {
	ID          uuid.UUID // the AMQP message_id, the same on every attempt
	AggregateID string
	Type        string
	Version     int
	Exchange    string
	RoutingKey  string
	Payload     []byte
	Headers     map[string]string
	Attempt     int // 1 on the first claim
	CreatedAt   time.Time
}

// Claim names one claim of a row: the row and the attempt that claimed it.
// Marks match both, so a relay can only mark rows it still holds.
type Claim struct {
	ID      uuid.UUID
	Attempt int
}

// Claim returns the claim of row r.
func (r Row) Claim() Claim { return Claim{ID: r.ID, Attempt: r.Attempt} }

// ClaimRows leases up to limit due PENDING rows to claimer for lease,
// oldest first, skipping rows other relays hold, and returns them oldest
// first. A row that is not marked before its lease ends is recovered by
// RecoverExpiredClaims.
func ClaimRows(ctx context.Context, db store.DBTX, claimer string, limit int, lease time.Duration) ([]Row, error) {
	rows, err := queries.ClaimOutbox(ctx, db, dbsqlc.ClaimOutboxParams{
		Claimer: &claimer, LeaseSeconds: lease.Seconds(), MaxRows: int32(limit),
	})
	if err != nil {
		return nil, fmt.Errorf("claim outbox rows: %w", store.Translate(err))
	}
	out := make([]Row, len(rows))
	for i, r := range rows {
		headers := map[string]string{}
		if err := json.Unmarshal(r.Headers, &headers); err != nil {
			// Headers are written by EnqueueMessages as a JSON object of
			// strings; anything else is a hand-made row. Publish without them.
			headers = map[string]string{}
		}
		out[i] = Row{
			ID: r.OutboxID, AggregateID: r.AggregateID, Type: r.MessageType, Version: int(r.MessageVersion),
			Exchange: r.ExchangeName, RoutingKey: r.RoutingKey, Payload: r.Payload, Headers: headers,
			Attempt: int(r.AttemptCount), CreatedAt: r.CreatedAt,
		}
	}
	// UPDATE ... RETURNING keeps no order: publish oldest first.
	slices.SortFunc(out, func(a, b Row) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		return slices.Compare(a.ID[:], b.ID[:])
	})
	return out, nil
}

func claimArrays(claims []Claim) ([]uuid.UUID, []int32) {
	ids := make([]uuid.UUID, len(claims))
	attempts := make([]int32, len(claims))
	for i, c := range claims {
		ids[i], attempts[i] = c.ID, int32(c.Attempt)
	}
	return ids, attempts
}

// MarkPublished marks the confirmed rows PUBLISHED, in one statement,
// and returns how many it marked (fewer when a lease was lost meanwhile).
func MarkPublished(ctx context.Context, db store.DBTX, claims []Claim) (int64, error) {
	if len(claims) == 0 {
		return 0, nil
	}
	ids, attempts := claimArrays(claims)
	n, err := queries.MarkOutboxPublished(ctx, db, dbsqlc.MarkOutboxPublishedParams{OutboxIds: ids, Attempts: attempts})
	if err != nil {
		return 0, fmt.Errorf("mark %d outbox rows published: %w", len(claims), store.Translate(err))
	}
	return n, nil
}

// PublishFailure is a claimed row the broker did not accept.
type PublishFailure struct {
	Claim
	Reason  string        // stored in last_error
	RetryIn time.Duration // the backoff before the next attempt
}

// MarkFailed sends failed rows back to PENDING after their backoff,
// or to FAILED once maxAttempts is spent, in one statement. It returns the
// ids that became FAILED.
func MarkFailed(ctx context.Context, db store.DBTX, failures []PublishFailure, maxAttempts int) ([]uuid.UUID, error) {
	if len(failures) == 0 {
		return nil, nil
	}
	p := dbsqlc.MarkOutboxFailedParams{MaxAttempts: int32(maxAttempts)}
	for _, f := range failures {
		p.OutboxIds = append(p.OutboxIds, f.ID)
		p.Attempts = append(p.Attempts, int32(f.Attempt))
		p.Errors = append(p.Errors, f.Reason)
		p.RetryInSeconds = append(p.RetryInSeconds, f.RetryIn.Seconds())
	}
	rows, err := queries.MarkOutboxFailed(ctx, db, p)
	if err != nil {
		return nil, fmt.Errorf("mark %d outbox rows failed: %w", len(failures), store.Translate(err))
	}
	var failed []uuid.UUID
	for _, r := range rows {
		if r.Status == "FAILED" {
			failed = append(failed, r.OutboxID)
		}
	}
	return failed, nil
}

// ReleaseClaims hands claimed rows back, due at once and with the
// attempt not counted: for rows a stopping relay never got to publish, or
// published without a confirm before its deadline.
func ReleaseClaims(ctx context.Context, db store.DBTX, claims []Claim) (int64, error) {
	if len(claims) == 0 {
		return 0, nil
	}
	ids, attempts := claimArrays(claims)
	n, err := queries.ReleaseOutboxClaims(ctx, db, dbsqlc.ReleaseOutboxClaimsParams{OutboxIds: ids, Attempts: attempts})
	if err != nil {
		return 0, fmt.Errorf("release %d outbox claims: %w", len(claims), store.Translate(err))
	}
	return n, nil
}

// RecoverExpiredClaims returns rows whose lease has run out to
// PENDING (or FAILED after the last attempt), and says how many.
func RecoverExpiredClaims(ctx context.Context, db store.DBTX, maxAttempts int) (int64, error) {
	n, err := queries.RecoverExpiredOutboxClaims(ctx, db, int32(maxAttempts))
	if err != nil {
		return 0, fmt.Errorf("recover expired outbox claims: %w", store.Translate(err))
	}
	return n, nil
}

// DeletePublished deletes up to limit rows published longer than
// retention ago, and says how many.
func DeletePublished(ctx context.Context, db store.DBTX, retention time.Duration, limit int) (int64, error) {
	n, err := queries.DeletePublishedOutbox(ctx, db, dbsqlc.DeletePublishedOutboxParams{
		RetentionSeconds: retention.Seconds(), MaxRows: int32(limit),
	})
	if err != nil {
		return 0, fmt.Errorf("delete published outbox rows: %w", store.Translate(err))
	}
	return n, nil
}

// Stat is the count of rows of one status and type.
type Stat struct {
	Status      string
	MessageType string
	Rows        int64
	// OldestAge is the age of the oldest row (PENDING only).
	OldestAge time.Duration
}

// Stats counts the PENDING, PUBLISHING and FAILED rows by type.
func Stats(ctx context.Context, db store.DBTX) ([]Stat, error) {
	rows, err := queries.OutboxStats(ctx, db)
	if err != nil {
		return nil, fmt.Errorf("outbox stats: %w", store.Translate(err))
	}
	out := make([]Stat, len(rows))
	for i, r := range rows {
		out[i] = Stat{Status: r.Status, MessageType: r.MessageType, Rows: r.RowCount,
			OldestAge: time.Duration(r.OldestAgeSeconds * float64(time.Second))}
	}
	return out, nil
}

// Retried is a FAILED row sent back to PENDING by RetryFailed.
type Retried struct {
	ID          uuid.UUID `json:"outbox_id"`
	Type        string    `json:"message_type"`
	AggregateID string    `json:"aggregate_id"`
	LastError   string    `json:"last_error"` // why its last publish failed
}

// RetryFailed sends FAILED rows back to PENDING, due now and with their
// attempts reset: the rows of ids, or with messageType set, every FAILED
// row of that type. Rows that are not FAILED are left alone. It is an
// operator's repair after the cause is fixed (orderctl outbox retry).
func RetryFailed(ctx context.Context, db store.DBTX, ids []uuid.UUID, messageType string) ([]Retried, error) {
	rows, err := queries.RetryFailedOutbox(ctx, db, dbsqlc.RetryFailedOutboxParams{
		OutboxIds: ids, MessageType: store.NilIfEmpty(messageType),
	})
	if err != nil {
		return nil, fmt.Errorf("retry failed outbox rows: %w", store.Translate(err))
	}
	out := make([]Retried, len(rows))
	for i, r := range rows {
		out[i] = Retried{ID: r.OutboxID, Type: r.MessageType, AggregateID: r.AggregateID, LastError: store.Deref(r.LastError)}
	}
	return out, nil
}
