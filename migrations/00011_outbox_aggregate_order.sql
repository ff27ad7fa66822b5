-- The relay publishes the messages of one aggregate (an order) in the
-- order they were written, one at a time: a row is claimed only when no
-- earlier row of its aggregate is still unpublished (PENDING, PUBLISHING
-- or FAILED). This index answers that question for each candidate row.
--
-- CONCURRENTLY, so that building it on a live table blocks no writes; it
-- cannot run in a transaction. A build that fails leaves an INVALID index
-- behind: drop it, and run the migration again.

-- +goose NO TRANSACTION

-- +goose Up
CREATE INDEX CONCURRENTLY message_outbox_unpublished_aggregate_idx
    ON message_outbox (aggregate_type, aggregate_id, created_at, outbox_id) WHERE status <> 'PUBLISHED';

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS message_outbox_unpublished_aggregate_idx;
