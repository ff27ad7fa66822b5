-- Idempotency keys are the caller's own: the same Idempotency-Key sent by
-- two callers names two requests. Before, a key was global, so a caller
-- who sent another's key got the other's stored response back (their
-- order). caller is the token's sub (internal/auth); '' when the API runs
-- with API_AUTH=off, and for the keys stored before this migration, which
-- no authenticated caller can then replay.

-- +goose Up
ALTER TABLE http_idempotency_key ADD COLUMN caller text NOT NULL DEFAULT '';
ALTER TABLE http_idempotency_key DROP CONSTRAINT http_idempotency_key_pkey;
ALTER TABLE http_idempotency_key ADD PRIMARY KEY (caller, request_method, request_path, idempotency_key);
-- order-api writes the caller with the key (docs/security.md).
GRANT INSERT (caller) ON http_idempotency_key TO orders_api;

-- +goose Down
-- Keys are global again: of the callers' copies of a key, the newest stays.
REVOKE INSERT (caller) ON http_idempotency_key FROM orders_api;
DELETE FROM http_idempotency_key k
USING http_idempotency_key newer
WHERE (newer.request_method, newer.request_path, newer.idempotency_key) = (k.request_method, k.request_path, k.idempotency_key)
  AND (newer.created_at, newer.caller) > (k.created_at, k.caller);
ALTER TABLE http_idempotency_key DROP CONSTRAINT http_idempotency_key_pkey;
ALTER TABLE http_idempotency_key DROP COLUMN caller;
ALTER TABLE http_idempotency_key ADD PRIMARY KEY (request_method, request_path, idempotency_key);
