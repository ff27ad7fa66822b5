-- Idempotency keys are scoped by the caller's role as well as its subject.
-- A token's sub is a customer id in a customer's token and an operator's
-- name in an operator's, and nothing keeps the two apart: an operator
-- named like a customer id shared that customer's keys, so the customer's
-- retry could be answered with the operator's stored order, or the other
-- way round.
--
-- The keys stored before this migration were written by tokens whose role
-- was not kept. caller '' is API_AUTH=off, where every request is an
-- operator's; any other is taken to be a customer's, the API's usual
-- caller. So an operator whose key is younger than IDEMPOTENCY_KEY_TTL (24h
-- by default) when this migration runs gets no replay for it: a retry of
-- that request across the upgrade creates a new order.

-- +goose Up
ALTER TABLE http_idempotency_key ADD COLUMN caller_role text;
UPDATE http_idempotency_key SET caller_role = CASE WHEN caller = '' THEN 'operator' ELSE 'customer' END;
ALTER TABLE http_idempotency_key ALTER COLUMN caller_role SET NOT NULL;
ALTER TABLE http_idempotency_key ADD CONSTRAINT http_idempotency_key_caller_role_check
    CHECK (caller_role IN ('customer', 'operator'));
ALTER TABLE http_idempotency_key DROP CONSTRAINT http_idempotency_key_pkey;
ALTER TABLE http_idempotency_key ADD PRIMARY KEY (caller_role, caller, request_method, request_path, idempotency_key);
-- order-api writes the caller's role with the key (docs/security.md).
GRANT INSERT (caller_role) ON http_idempotency_key TO orders_api;

-- +goose Down
-- Keys are the subject's again: of the copies of a key under two roles, the
-- newest stays.
REVOKE INSERT (caller_role) ON http_idempotency_key FROM orders_api;
DELETE FROM http_idempotency_key k
USING http_idempotency_key newer
WHERE (newer.caller, newer.request_method, newer.request_path, newer.idempotency_key) = (k.caller, k.request_method, k.request_path, k.idempotency_key)
  AND (newer.created_at, newer.caller_role) > (k.created_at, k.caller_role);
ALTER TABLE http_idempotency_key DROP CONSTRAINT http_idempotency_key_pkey;
ALTER TABLE http_idempotency_key DROP COLUMN caller_role;
ALTER TABLE http_idempotency_key ADD PRIMARY KEY (caller, request_method, request_path, idempotency_key);
