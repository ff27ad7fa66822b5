package outboxtest

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/messaging/outbox/dbsqlc"
)

// Fixtures for the tests of packages that read the outbox's table (an
// order's timeline, orderctl) and have no broker: they put rows in the
// states a relay leaves them in, with the outbox's own statements.

var queries = dbsqlc.New()

// PublishDue claims the due rows as relay claimer and marks them
// PUBLISHED, as the relay does once the broker confirmed them, and
// returns their ids.
func PublishDue(ctx context.Context, db database.DBTX, claimer string) ([]uuid.UUID, error) {
	c, err := claimDue(ctx, db, claimer)
	if err != nil || len(c.ids) == 0 {
		return nil, err
	}
	ids := c.ids
	p := dbsqlc.MarkOutboxParams{PublishedIds: ids, PublishedCreated: c.created, Oldest: c.oldest, Newest: c.newest}
	for range ids {
		p.PublishedTokens = append(p.PublishedTokens, c.token)
	}
	if _, err := queries.MarkOutbox(ctx, db, p); err != nil {
		return nil, fmt.Errorf("mark %d outbox rows PUBLISHED: %w", len(ids), err)
	}
	return ids, nil
}

// FailDue claims the due rows as relay claimer and marks them as the
// relay does when the broker refused them on their last attempt: FAILED,
// with reason as last_error. It returns their ids.
func FailDue(ctx context.Context, db database.DBTX, claimer, reason string) ([]uuid.UUID, error) {
	c, err := claimDue(ctx, db, claimer)
	if err != nil || len(c.ids) == 0 {
		return nil, err
	}
	ids := c.ids
	p := dbsqlc.MarkOutboxParams{RefusedIds: ids, RefusedCreated: c.created, Oldest: c.oldest, Newest: c.newest, MaxAttempts: 1}
	for range ids {
		p.RefusedTokens = append(p.RefusedTokens, c.token)
		p.RefusedErrors = append(p.RefusedErrors, reason)
		p.RefusedRetryInSeconds = append(p.RefusedRetryInSeconds, 0)
	}
	if _, err := queries.MarkOutbox(ctx, db, p); err != nil {
		return nil, fmt.Errorf("mark %d outbox rows FAILED: %w", len(ids), err)
	}
	return ids, nil
}

// claimed is what claimDue took: the rows' keys, in the same order, the
// span of their created_at, and the claim's token.
type claimed struct {
	ids            []uuid.UUID
	created        []time.Time
	oldest, newest time.Time
	token          string
}

// claimDue claims every due row (ClaimOutbox) under one token.
func claimDue(ctx context.Context, db database.DBTX, claimer string) (claimed, error) {
	c := claimed{token: claimer + "/outboxtest"}
	rows, err := queries.ClaimOutbox(ctx, db, dbsqlc.ClaimOutboxParams{
		Claimer: &c.token, LeaseSeconds: time.Minute.Seconds(), MaxRows: 1000, HeldTypes: []string{},
	})
	if err != nil {
		return claimed{}, fmt.Errorf("claim the due outbox rows: %w", err)
	}
	for i, r := range rows {
		c.ids, c.created = append(c.ids, r.OutboxID), append(c.created, r.CreatedAt)
		if i == 0 || r.CreatedAt.Before(c.oldest) {
			c.oldest = r.CreatedAt
		}
		if i == 0 || r.CreatedAt.After(c.newest) {
			c.newest = r.CreatedAt
		}
	}
	return c, nil
}
