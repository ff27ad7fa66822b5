-- name: ClaimIdempotencyKey :one
-- Takes a caller's key for this request, in one round trip. First the
-- advisory lock on the key, held until the transaction ends: a request that
-- finds it taken (locked false) answers 409 at once instead of waiting
-- behind the first one. Only then, holding it, inserts the key or takes
-- over one whose TTL has run out; claimed false with locked true means the
-- key belongs to an earlier request. The primary key, not a prior SELECT,
-- decides between concurrent requests. (A CTE read twice, or calling a
-- volatile function, is evaluated once, before the INSERT reads it.)
WITH lock AS (
    SELECT pg_try_advisory_xact_lock(hashtextextended(@lock_key::text, 0)) AS locked
), claim AS (
    INSERT INTO http_idempotency_key (caller_role, caller, request_method, request_path, idempotency_key, request_hash)
    SELECT @caller_role::text, @caller::text, @request_method::text, @request_path::text, @idempotency_key::text, @request_hash::text
    FROM lock
    WHERE lock.locked
    ON CONFLICT (caller_role, caller, request_method, request_path, idempotency_key) DO UPDATE
    SET request_hash = excluded.request_hash,
        response_status = NULL,
        response_body = NULL,
        response_location = NULL,
        created_at = now()
    WHERE http_idempotency_key.created_at < now() - make_interval(secs => @ttl_seconds::float8)
    RETURNING idempotency_key
)
SELECT lock.locked, EXISTS (SELECT 1 FROM claim) AS claimed
FROM lock;

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
