package outbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"

	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/messaging/outbox/dbsqlc"
	"github.com/yourorg/orders/internal/messaging/outbox/internal/pipeline"
)

// The relay's side of the outbox table: claim rows, then mark each one by
// what the broker said. See docs/state-machines.md for the row's life cycle.

// Row is a claimed outbox row: a message to publish.
type Row = pipeline.Row

// claimScope narrows a claim: the message types held back, and the
// partitions the relay holds (none: the whole outbox).
type claimScope struct {
	held       []string
	partitions int     // 0: not partitioned
	mine       []int32 // with partitions: the partitions this relay holds
	// sweep: the claim is a log-tailing relay's sweep, which takes only rows
	// written before before, or whose last publish failed (sweepReady
	// false: claim nothing).
	sweep      bool
	sweepReady bool
	before     time.Time
	// after: the claim takes only rows after it in (created_at, outbox_id)
	// order (claimFloor); zero: from the start.
	after claimFloor
}

// claimFloor is where a claim's scan starts: the last row of the claim
// before it, in (created_at, outbox_id) order. The zero value starts it
// at the beginning.
type claimFloor struct {
	createdAt time.Time
	id        uuid.UUID
}

// sameRows reports whether a claim in s may take the rows of a claim in
// o: the same types held and the same partitions, so that a floor set by
// a claim in o holds for one in s.
func (s claimScope) sameRows(o claimScope) bool {
	return slices.Equal(s.held, o.held) && s.partitions == o.partitions && slices.Equal(s.mine, o.mine) && s.sweep == o.sweep
}

// claimRows leases up to limit due PENDING rows within scope (after
// scope.after) to claimer for lease, oldest first, skipping rows other
// relays hold, and returns them oldest first. Each call is a claim of its own: claimed_by is its
// token (newClaimToken), which no other claim has. Whatever the scope, a
// row is claimed only when no earlier row of its aggregate is unpublished:
// the messages of one aggregate go out one at a time, in order. A row that
// is not marked before its lease ends is recovered by recoverExpiredClaims.
func claimRows(ctx context.Context, db database.DBTX, token string, limit int, lease time.Duration, scope claimScope) ([]Row, error) {
	held := append([]string{}, scope.held...) // never NULL: <> ALL (NULL) matches no row
	var before *time.Time
	if scope.sweep {
		before = &scope.before
	}
	// The relay's configuration picks the statement: the whole outbox, or
	// its partitions. The two return the same columns.
	var rows []dbsqlc.ClaimOutboxRow
	var err error
	if scope.partitions == 0 {
		rows, err = queries.ClaimOutbox(ctx, db, dbsqlc.ClaimOutboxParams{
			Claimer: &token, LeaseSeconds: lease.Seconds(), MaxRows: int32(limit),
			HeldTypes: held, CreatedBefore: before, AfterCreated: scope.after.createdAt, AfterID: scope.after.id,
		})
	} else {
		var in []dbsqlc.ClaimOutboxInPartitionsRow
		in, err = queries.ClaimOutboxInPartitions(ctx, db, dbsqlc.ClaimOutboxInPartitionsParams{
			Claimer: &token, LeaseSeconds: lease.Seconds(), MaxRows: int32(limit),
			HeldTypes: held, CreatedBefore: before, AfterCreated: scope.after.createdAt, AfterID: scope.after.id,
			Partitions: int32(scope.partitions), Mine: scope.mine,
		})
		for _, r := range in {
			rows = append(rows, dbsqlc.ClaimOutboxRow(r))
		}
	}
	if err != nil {
		return nil, fmt.Errorf("claim outbox rows: %w", database.Translate(err))
	}
	out := make([]Row, len(rows))
	for i, r := range rows {
		headers := map[string]string{}
		if err := json.Unmarshal(r.Headers, &headers); err != nil {
			// Headers are written by Writer.Write as a JSON object of
			// strings; anything else is a hand-made row. Publish without them.
			headers = map[string]string{}
		}
		out[i] = Row{
			ID: r.OutboxID, AggregateID: r.AggregateID, Type: r.MessageType, Version: int(r.MessageVersion),
			Exchange: r.ExchangeName, RoutingKey: r.RoutingKey, Payload: r.Payload, Headers: headers,
			Attempt: int(r.AttemptCount), ClaimToken: database.Deref(r.ClaimedBy), CreatedAt: r.CreatedAt,
			Partition: int(r.Partition),
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

// newClaimToken is the token of a claim of claimer: its id, and 8 random
// bytes in hex that make the token unique.
func newClaimToken(claimer string) string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return claimer + "/" + hex.EncodeToString(b[:])
}

// giveBackClaims makes the rows of the claims of tokens, those whose
// outcome the relay does not know, PENDING again, the attempt given back,
// and says how many there were (GiveBackOutboxClaims).
func giveBackClaims(ctx context.Context, db database.DBTX, tokens []string) (int64, error) {
	n, err := queries.GiveBackOutboxClaims(ctx, db, tokens)
	if err != nil {
		return 0, fmt.Errorf("give back claims of unknown outcome: %w", database.Translate(err))
	}
	return n, nil
}

// markRows writes the outcomes of a batch of claimed rows in one
// statement (one round trip, one commit), each row found by its whole key
// within the batch's span of time partitions and fenced by its claim's
// token, so that a retry of a markRows that took effect changes nothing.
// Released rows are due after each one's RetryIn, with its Reason (if
// any) in last_error; refused ones likewise, or FAILED once maxAttempts
// is spent.
func markRows(ctx context.Context, db database.DBTX, m pipeline.Marks, maxAttempts int) (pipeline.Marked, error) {
	n := len(m.Published) + len(m.Refused) + len(m.Released)
	if n == 0 {
		return pipeline.Marked{}, nil
	}
	p := dbsqlc.MarkOutboxParams{MaxAttempts: int32(maxAttempts)}
	p.Oldest, p.Newest = m.Span()
	for _, c := range m.Published {
		p.PublishedIds = append(p.PublishedIds, c.ID)
		p.PublishedCreated = append(p.PublishedCreated, c.CreatedAt)
		p.PublishedTokens = append(p.PublishedTokens, c.Token)
	}
	for _, f := range m.Refused {
		p.RefusedIds = append(p.RefusedIds, f.ID)
		p.RefusedCreated = append(p.RefusedCreated, f.CreatedAt)
		p.RefusedTokens = append(p.RefusedTokens, f.Token)
		p.RefusedErrors = append(p.RefusedErrors, f.Reason)
		p.RefusedRetryInSeconds = append(p.RefusedRetryInSeconds, f.RetryIn.Seconds())
	}
	for _, r := range m.Released {
		p.ReleasedIds = append(p.ReleasedIds, r.ID)
		p.ReleasedCreated = append(p.ReleasedCreated, r.CreatedAt)
		p.ReleasedTokens = append(p.ReleasedTokens, r.Token)
		p.ReleasedErrors = append(p.ReleasedErrors, r.Reason) // "": keep last_error
		p.ReleasedRetryInSeconds = append(p.ReleasedRetryInSeconds, r.RetryIn.Seconds())
	}
	row, err := queries.MarkOutbox(ctx, db, p)
	if err != nil {
		return pipeline.Marked{}, fmt.Errorf("mark %d outbox rows (%d published, %d refused, %d released): %w",
			n, len(m.Published), len(m.Refused), len(m.Released), database.Translate(err))
	}
	return pipeline.Marked{Published: row.Published, Refused: row.Refused, Released: row.Released, Failed: row.FailedIds}, nil
}

// everLease is a window that holds every lease that ever ran out.
const everLease = 100 * 365 * 24 * time.Hour

// recoverExpiredClaims returns rows whose lease has run out within the
// last window (0: ever) to PENDING, with the attempt their claim counted
// given back (a relay's death is not the message's fault), and returns
// their ids.
func recoverExpiredClaims(ctx context.Context, db database.DBTX, window time.Duration) ([]uuid.UUID, error) {
	if window <= 0 {
		window = everLease
	}
	ids, err := queries.RecoverExpiredOutboxClaims(ctx, db, window.Seconds())
	if err != nil {
		return nil, fmt.Errorf("recover expired outbox claims: %w", database.Translate(err))
	}
	return ids, nil
}
