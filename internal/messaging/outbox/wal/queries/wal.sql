-- name: MarkStreamed :one
-- The log-tailing relay's write-back (stream.go): what became of the rows it
-- published from the write-ahead log, in one statement, so that orderctl,
-- the timeline page and the gauges say what poll mode would. The log
-- stream claims nothing, so a row it published is still PENDING; the
-- statement touches only such rows. A row the sweep has claimed meanwhile
-- (PUBLISHING), or that is PUBLISHED or FAILED already, is left alone.
--   - published: confirmed: PUBLISHED, the attempt counted;
--   - refused: returned as unroutable: the attempt counted, due again after
--     its backoff, FAILED once max_attempts is spent;
--   - released: nacked by the broker: the attempt not counted, due after
--     retry_in.
-- A refused or released row gets its last_error, which hands it to the
-- sweep (the claim with created_before): the stream never comes back to a
-- row. Rows are found by their whole key, (outbox_id, created_at), within
-- the batch's span of created_at, so that only the time partitions the
-- batch was written in are planned and touched (MarkOutbox says why).
WITH published AS (
    UPDATE message_outbox m
    SET status = 'PUBLISHED', published_at = now(), attempt_count = m.attempt_count + 1,
        last_error = NULL, updated_at = now()
    FROM (SELECT unnest(@published_ids::uuid[]) AS outbox_id, unnest(@published_created::timestamptz[]) AS created_at) AS c
    WHERE m.outbox_id = c.outbox_id AND m.created_at = c.created_at AND m.status = 'PENDING'
      AND m.created_at BETWEEN @oldest::timestamptz AND @newest::timestamptz
    RETURNING m.outbox_id
), refused AS (
    UPDATE message_outbox m
    SET attempt_count = m.attempt_count + 1,
        status = CASE WHEN m.attempt_count + 1 >= @max_attempts::integer THEN 'FAILED' ELSE 'PENDING' END,
        next_attempt_at = now() + make_interval(secs => c.retry_in),
        last_error = c.error, updated_at = now()
    FROM (SELECT unnest(@refused_ids::uuid[]) AS outbox_id, unnest(@refused_created::timestamptz[]) AS created_at,
                 unnest(@refused_errors::text[]) AS error, unnest(@refused_retry_in_seconds::float8[]) AS retry_in) AS c
    WHERE m.outbox_id = c.outbox_id AND m.created_at = c.created_at AND m.status = 'PENDING'
      AND m.created_at BETWEEN @oldest::timestamptz AND @newest::timestamptz
    RETURNING m.outbox_id, m.status
), released AS (
    UPDATE message_outbox m
    SET next_attempt_at = now() + make_interval(secs => c.retry_in), last_error = c.error, updated_at = now()
    FROM (SELECT unnest(@released_ids::uuid[]) AS outbox_id, unnest(@released_created::timestamptz[]) AS created_at,
                 unnest(@released_errors::text[]) AS error, unnest(@released_retry_in_seconds::float8[]) AS retry_in) AS c
    WHERE m.outbox_id = c.outbox_id AND m.created_at = c.created_at AND m.status = 'PENDING'
      AND m.created_at BETWEEN @oldest::timestamptz AND @newest::timestamptz
    RETURNING m.outbox_id
)
SELECT (SELECT count(*) FROM published)::bigint AS published,
       (SELECT count(*) FROM refused)::bigint AS refused,
       (SELECT count(*) FROM released)::bigint AS released,
       coalesce((SELECT array_agg(outbox_id) FROM refused WHERE status = 'FAILED'), '{}')::uuid[] AS failed_ids;

-- name: PendingIDs :many
-- The PENDING rows, in write order. Read through the snapshot a new
-- replication slot exports (stream.go, rowsBeforeSlot), they are the rows
-- the slot will never stream: those committed before it.
SELECT outbox_id FROM message_outbox WHERE status = 'PENDING' ORDER BY created_at, outbox_id;

-- name: UnsweptRows :many
-- Those of ids still PENDING and not handed to the sweep (no last_error),
-- in write order: the rows written before a new slot, which the stream
-- publishes before the slot's first transaction (stream.go, passBacklog).
SELECT outbox_id, aggregate_id, message_type, message_version, exchange_name,
       routing_key, payload, headers, attempt_count, created_at
FROM message_outbox
WHERE outbox_id = ANY (@ids::uuid[]) AND status = 'PENDING' AND last_error IS NULL
ORDER BY created_at, outbox_id;
