-- The inbox's read API (package inboxadmin): what operators, tools and pages are
-- shown of its rows. Outside the inbox, nothing names the table.

-- name: ReadInbox :one
-- The row of one message for one consumer.
SELECT * FROM message_inbox
WHERE consumer_name = @consumer_name AND message_id = @message_id;

-- name: ReadInboxOfAggregate :many
-- Every consumer's rows of one aggregate, by first delivery
-- (message_inbox_aggregate_idx).
SELECT * FROM message_inbox
WHERE aggregate_id = @aggregate_id
ORDER BY first_received_at, consumer_name, message_id;

-- name: MayReadInbox :one
-- Whether the role may read the table: order-api's may not.
SELECT has_table_privilege('message_inbox', 'SELECT');

-- name: ReadOrderInbox :many
-- ReadInboxOfAggregate of an order for order-api's role: through
-- order_timeline_inbox (migrations/00008_roles.sql), each row as a JSON
-- object of the function's columns (sqlc cannot type them).
SELECT to_jsonb(i)::jsonb FROM order_timeline_inbox(@order_id::uuid) AS i;

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
