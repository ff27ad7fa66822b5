package store

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/store/dbsqlc"
)

var (
	// ErrKeyInFlight: another request with this Idempotency-Key is running.
	ErrKeyInFlight = errors.New("a request with this Idempotency-Key is in progress")
	// ErrKeyReused: the key was first used with a different request body.
	ErrKeyReused = errors.New("this Idempotency-Key was used with a different request")
)

// IdempotentRequest identifies a request that carries an Idempotency-Key.
// A key is its caller's: the same key from two callers names two requests,
// so that no caller can replay another's key to read its response. A
// caller is a role and a subject: a customer and an operator whose tokens
// name the same sub are two callers.
type IdempotentRequest struct {
	// CallerRole is the caller's role (customer or operator; operator with
	// authentication off).
	CallerRole string
	// Caller is who sent the request (the token's sub; "" with
	// authentication off).
	Caller       string
	Method, Path string
	Key          string
	// Hash of the canonical request body: the same key must come with the
	// same body.
	Hash string
}

// lockKey names the key for the advisory lock. The role and the caller
// are quoted, so that no caller and path together can spell another's.
func (r IdempotentRequest) lockKey() string {
	return strconv.Quote(r.CallerRole) + " " + strconv.Quote(r.Caller) + " " + r.Method + " " + r.Path + " " + r.Key
}

// StoredResponse is the first response to a key, returned again on replay.
type StoredResponse struct {
	Status   int
	Body     []byte
	Location string
}

// ClaimIdempotencyKey takes req.Key for this request, in the transaction
// that will also do the work. It returns:
//   - nil, nil: the key is this request's; do the work, then call
//     CompleteIdempotencyKey in the same transaction.
//   - a response, nil: an earlier request with the same body completed;
//     answer with its response and do nothing.
//   - ErrKeyInFlight or ErrKeyReused.
//
// A key older than ttl is free again. The primary key of
// http_idempotency_key decides between concurrent requests; the advisory
// lock only turns "wait for the other request" into ErrKeyInFlight.
func ClaimIdempotencyKey(ctx context.Context, tx database.DBTX, req IdempotentRequest, ttl time.Duration) (*StoredResponse, error) {
	// The lock and the claim in one statement, one round trip: the claim
	// runs only once the lock is held.
	claim, err := queries.ClaimIdempotencyKey(ctx, tx, dbsqlc.ClaimIdempotencyKeyParams{
		LockKey:        req.lockKey(),
		CallerRole:     req.CallerRole,
		Caller:         req.Caller,
		RequestMethod:  req.Method,
		RequestPath:    req.Path,
		IdempotencyKey: req.Key,
		RequestHash:    req.Hash,
		TtlSeconds:     ttl.Seconds(),
	})
	switch {
	case err != nil:
		return nil, fmt.Errorf("claim idempotency key: %w", Translate(err))
	case !claim.Locked:
		return nil, ErrKeyInFlight
	case claim.Claimed:
		return nil, nil // inserted, or took over an expired key
	}
	// The key is taken and not expired: this is a repeat.
	row, err := queries.GetIdempotencyKey(ctx, tx, dbsqlc.GetIdempotencyKeyParams{
		CallerRole: req.CallerRole, Caller: req.Caller, RequestMethod: req.Method, RequestPath: req.Path, IdempotencyKey: req.Key,
	})
	if err != nil {
		return nil, fmt.Errorf("read idempotency key: %w", Translate(err))
	}
	switch {
	case row.RequestHash != req.Hash:
		return nil, ErrKeyReused
	case row.ResponseStatus == nil:
		return nil, ErrKeyInFlight
	}
	return &StoredResponse{Status: int(*row.ResponseStatus), Body: row.ResponseBody, Location: database.Deref(row.ResponseLocation)}, nil
}

// CompleteIdempotencyKey stores the response to a key claimed in this
// transaction.
func CompleteIdempotencyKey(ctx context.Context, tx database.DBTX, req IdempotentRequest, resp StoredResponse) error {
	status := int32(resp.Status)
	err := queries.CompleteIdempotencyKey(ctx, tx, dbsqlc.CompleteIdempotencyKeyParams{
		CallerRole:       req.CallerRole,
		Caller:           req.Caller,
		RequestMethod:    req.Method,
		RequestPath:      req.Path,
		IdempotencyKey:   req.Key,
		ResponseStatus:   &status,
		ResponseBody:     resp.Body,
		ResponseLocation: database.NilIfEmpty(resp.Location),
	})
	if err != nil {
		return fmt.Errorf("store idempotent response: %w", Translate(err))
	}
	return nil
}

// DeleteExpiredIdempotencyKeys deletes up to limit keys older than ttl and
// returns how many it deleted.
func DeleteExpiredIdempotencyKeys(ctx context.Context, db database.DBTX, ttl time.Duration, limit int) (int64, error) {
	n, err := queries.DeleteExpiredIdempotencyKeys(ctx, db, dbsqlc.DeleteExpiredIdempotencyKeysParams{
		TtlSeconds: ttl.Seconds(), MaxRows: int32(limit),
	})
	if err != nil {
		return 0, fmt.Errorf("delete expired idempotency keys: %w", Translate(err))
	}
	return n, nil
}
