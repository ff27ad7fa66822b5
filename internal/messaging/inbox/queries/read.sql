-- The inbox's read API (package inboxadmin): what operators, tools and pages are
-- shown of its rows. Outside the inbox, nothing names the table.

-- name: ReadInbox :one
-- The row of one message for one consumer.
SELECT * FROM message_inbox
WHERE consumer_name = @consumer_name AND message_id = @message_id;

-- name: ReadInboxOfAggregate :many
-- Every consumer's rows of one aggregate (message_inbox_aggregate_idx):
-- through inbox_rows_of_aggregate (migrations/00002), which a role without
-- SELECT on the table may be granted; each row as a JSON object of the
-- function's columns (every column but the payload hash), which sqlc
-- cannot type.
SELECT to_jsonb(i)::jsonb FROM inbox_rows_of_aggregate(@aggregate_id) AS i;

-- name: ReadInboxOfAggregateSince :many
-- ReadInboxOfAggregate of the rows first received at since or later,
-- through inbox_rows_of_aggregate_since (migrations/00006): only the time
-- partitions from since on are read.
SELECT to_jsonb(i)::jsonb FROM inbox_rows_of_aggregate_since(@aggregate_id, @since) AS i;

-- name: ReadUnprocessedInbox :many
-- Up to max_rows rows not PROCESSED, the first received first
-- (message_inbox_unprocessed_idx).
SELECT * FROM message_inbox
WHERE status <> 'PROCESSED'
ORDER BY first_received_at
LIMIT @max_rows;

-- name: InboxStats :many
-- Rows not PROCESSED, by consumer and status, with the oldest's age.
SELECT consumer_name, status, count(*)::bigint AS row_count,
       extract(epoch FROM now() - min(first_received_at))::float8 AS oldest_age_seconds
FROM message_inbox
WHERE status <> 'PROCESSED'
GROUP BY consumer_name, status;
