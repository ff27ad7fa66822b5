-- name: ClaimIdempotencyKey :one
-- Takes a caller's key for this request: inserts it, or takes over one whose TTL has
-- run out. No row back means the key belongs to an earlier request. The
-- primary key, not a prior SELECT, decides between concurrent requests.
INSERT INTO http_idempotency_key (caller_role, caller, request_method, request_path, idempotency_key, request_hash)
VALUES (@caller_role, @caller, @request_method, @request_path, @idempotency_key, @request_hash)
ON CONFLICT (caller_role, caller, request_method, request_path, idempotency_key) DO UPDATE
SET request_hash = excluded.request_hash,
    response_status = NULL,
    response_body = NULL,
    response_location = NULL,
    created_at = now()
WHERE http_idempotency_key.created_at < now() - make_interval(secs => @ttl_seconds::float8)
RETURNING idempotency_key;

-- name: GetIdempotencyKey :one
SELECT request_hash, response_status, response_body, response_location
FROM http_idempotency_key
WHERE caller_role = @caller_role AND caller = @caller AND request_method = @request_method
  AND request_path = @request_path AND idempotency_key = @idempotency_key;

-- name: CompleteIdempotencyKey :exec
UPDATE http_idempotency_key
SET response_status = @response_status, response_body = @response_body, response_location = @response_location
WHERE caller_role = @caller_role AND caller = @caller AND request_method = @request_method
  AND request_path = @request_path AND idempotency_key = @idempotency_key;

-- name: DeleteExpiredIdempotencyKeys :execrows
DELETE FROM http_idempotency_key
WHERE (caller_role, caller, request_method, request_path, idempotency_key) IN (
    SELECT caller_role, caller, request_method, request_path, idempotency_key
    FROM http_idempotency_key
    WHERE created_at < now() - make_interval(secs => @ttl_seconds::float8)
    LIMIT @max_rows
);

-- name: TryLockIdempotencyKey :one
-- Held until the transaction ends. A request that finds the key locked
-- answers 409 at once instead of waiting behind the first one.
SELECT pg_try_advisory_xact_lock(hashtextextended(@lock_key::text, 0));
