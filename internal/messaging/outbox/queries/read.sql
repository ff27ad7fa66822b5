-- The outbox's read API (package outboxadmin): what operators, tools and
-- pages are shown of its rows. Outside the outbox, nothing names the
-- table. The queries of messages return the columns of ReadFailedOutbox,
-- in its order, so that outboxadmin converts each row to one type; they
-- are the columns of outbox_messages_of_aggregate (ReadOutboxOfAggregate).
-- A header that is not a string is none.

-- name: ReadOutboxOfAggregate :many
-- Every message of one aggregate (message_outbox_aggregate_idx): through
-- outbox_messages_of_aggregate (migrations/00007), which a role without
-- SELECT on the table may be granted; each row as a JSON object of the
-- function's columns, which sqlc cannot type.
SELECT to_jsonb(m)::jsonb FROM outbox_messages_of_aggregate(@aggregate_type, @aggregate_id) AS m;

-- name: ReadOutboxOfAggregateSince :many
-- ReadOutboxOfAggregate of the messages written at since or later, through
-- outbox_messages_of_aggregate_since (migrations/00013): only the time
-- partitions from since on are read.
SELECT to_jsonb(m)::jsonb FROM outbox_messages_of_aggregate_since(@aggregate_type, @aggregate_id, @since) AS m;

-- name: ReadFailedOutbox :many
-- The FAILED rows, of one type or all (message_type NULL), the earliest
-- failed first (message_outbox_failed_idx).
SELECT outbox_id, aggregate_id, message_type, status, attempt_count,
       coalesce(CASE jsonb_typeof(headers -> 'app_id') WHEN 'string' THEN headers ->> 'app_id' END, '')::text AS producer,
       coalesce(CASE jsonb_typeof(headers -> 'correlation_id') WHEN 'string' THEN headers ->> 'correlation_id' END, '')::text AS correlation_id,
       coalesce(CASE jsonb_typeof(headers -> 'causation_id') WHEN 'string' THEN headers ->> 'causation_id' END, '')::text AS causation_id,
       coalesce(CASE jsonb_typeof(headers -> 'traceparent') WHEN 'string' THEN headers ->> 'traceparent' END, '')::text AS traceparent,
       created_at, updated_at, next_attempt_at, published_at, coalesce(last_error, '')::text AS last_error
FROM message_outbox
WHERE status = 'FAILED' AND (message_type = sqlc.narg(message_type) OR sqlc.narg(message_type) IS NULL)
ORDER BY updated_at
LIMIT @max_rows;

-- name: ReadStuckOutbox :many
-- What needs a look, up to max_rows of each kind, each on its partial
-- index: FAILED rows, the earliest failed first; then PENDING and
-- PUBLISHING rows written more than older_than_seconds ago, oldest first.
(SELECT outbox_id, aggregate_id, message_type, status, attempt_count,
       coalesce(CASE jsonb_typeof(headers -> 'app_id') WHEN 'string' THEN headers ->> 'app_id' END, '')::text AS producer,
       coalesce(CASE jsonb_typeof(headers -> 'correlation_id') WHEN 'string' THEN headers ->> 'correlation_id' END, '')::text AS correlation_id,
       coalesce(CASE jsonb_typeof(headers -> 'causation_id') WHEN 'string' THEN headers ->> 'causation_id' END, '')::text AS causation_id,
       coalesce(CASE jsonb_typeof(headers -> 'traceparent') WHEN 'string' THEN headers ->> 'traceparent' END, '')::text AS traceparent,
       created_at, updated_at, next_attempt_at, published_at, coalesce(last_error, '')::text AS last_error
 FROM message_outbox WHERE status = 'FAILED' ORDER BY updated_at LIMIT @max_rows)
UNION ALL
(SELECT outbox_id, aggregate_id, message_type, status, attempt_count,
       coalesce(CASE jsonb_typeof(headers -> 'app_id') WHEN 'string' THEN headers ->> 'app_id' END, '')::text AS producer,
       coalesce(CASE jsonb_typeof(headers -> 'correlation_id') WHEN 'string' THEN headers ->> 'correlation_id' END, '')::text AS correlation_id,
       coalesce(CASE jsonb_typeof(headers -> 'causation_id') WHEN 'string' THEN headers ->> 'causation_id' END, '')::text AS causation_id,
       coalesce(CASE jsonb_typeof(headers -> 'traceparent') WHEN 'string' THEN headers ->> 'traceparent' END, '')::text AS traceparent,
       created_at, updated_at, next_attempt_at, published_at, coalesce(last_error, '')::text AS last_error
 FROM message_outbox WHERE status = 'PENDING' AND created_at < now() - make_interval(secs => @older_than_seconds)
 ORDER BY created_at LIMIT @max_rows)
UNION ALL
(SELECT outbox_id, aggregate_id, message_type, status, attempt_count,
       coalesce(CASE jsonb_typeof(headers -> 'app_id') WHEN 'string' THEN headers ->> 'app_id' END, '')::text AS producer,
       coalesce(CASE jsonb_typeof(headers -> 'correlation_id') WHEN 'string' THEN headers ->> 'correlation_id' END, '')::text AS correlation_id,
       coalesce(CASE jsonb_typeof(headers -> 'causation_id') WHEN 'string' THEN headers ->> 'causation_id' END, '')::text AS causation_id,
       coalesce(CASE jsonb_typeof(headers -> 'traceparent') WHEN 'string' THEN headers ->> 'traceparent' END, '')::text AS traceparent,
       created_at, updated_at, next_attempt_at, published_at, coalesce(last_error, '')::text AS last_error
 FROM message_outbox WHERE status = 'PUBLISHING' AND created_at < now() - make_interval(secs => @older_than_seconds)
 ORDER BY created_at LIMIT @max_rows);

-- name: RetryFailedOutbox :many
-- An operator's retry (orderctl outbox retry), after fixing the cause:
-- FAILED rows back to PENDING, due now, with a fresh attempt budget. The
-- rows keep their outbox_id, so consumers still deduplicate, and their
-- last_error until the publish clears it. Either the rows named, or every
-- FAILED row of one message type.
UPDATE message_outbox
SET status = 'PENDING', attempt_count = 0, next_attempt_at = now(), updated_at = now()
WHERE status = 'FAILED'
  AND (outbox_id = ANY (@outbox_ids::uuid[]) OR message_type = sqlc.narg(message_type))
RETURNING outbox_id, aggregate_id, message_type, status, attempt_count,
       coalesce(CASE jsonb_typeof(headers -> 'app_id') WHEN 'string' THEN headers ->> 'app_id' END, '')::text AS producer,
       coalesce(CASE jsonb_typeof(headers -> 'correlation_id') WHEN 'string' THEN headers ->> 'correlation_id' END, '')::text AS correlation_id,
       coalesce(CASE jsonb_typeof(headers -> 'causation_id') WHEN 'string' THEN headers ->> 'causation_id' END, '')::text AS causation_id,
       coalesce(CASE jsonb_typeof(headers -> 'traceparent') WHEN 'string' THEN headers ->> 'traceparent' END, '')::text AS traceparent,
       created_at, updated_at, next_attempt_at, published_at, coalesce(last_error, '')::text AS last_error;

-- name: OutboxStats :many
-- The backlog for the relay's gauges; each branch uses its partial index.
SELECT status, message_type, count(*)::bigint AS row_count,
       coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8 AS oldest_age_seconds
FROM message_outbox WHERE status = 'PENDING' GROUP BY status, message_type
UNION ALL
SELECT status, message_type, count(*)::bigint, 0::float8
FROM message_outbox WHERE status = 'PUBLISHING' GROUP BY status, message_type
UNION ALL
SELECT status, message_type, count(*)::bigint, 0::float8
FROM message_outbox WHERE status = 'FAILED' GROUP BY status, message_type;

-- name: ReadOutboxRow :one
-- One row as the relay publishes it, payload and all: for a tool that
-- publishes a message again (the walkthrough's duplicate).
SELECT outbox_id, aggregate_id, message_type, message_version, exchange_name, routing_key,
       payload, headers, attempt_count, created_at
FROM message_outbox
WHERE outbox_id = @outbox_id;
