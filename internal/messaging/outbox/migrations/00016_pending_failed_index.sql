-- The PENDING rows whose last publish failed (last_error set) get an index
-- of their own, in the claim's order. The log-tailing relay's sweep
-- (ClaimOutbox with created_before) claims the rows written before its
-- cutoff, or whose last publish failed: as one condition, the scan of
-- message_outbox_pending_idx had no upper bound, and while a session held
-- the xmin horizon it walked the index entry of every row claimed since,
-- the stream's included (342 ms a poll, issue 28). The claim now scans
-- message_outbox_pending_idx only up to created_before, and this index for
-- the failed rows written since. Building it blocks writes to
-- message_outbox while it reads the table once.

-- +goose Up
CREATE INDEX message_outbox_pending_failed_idx ON message_outbox (created_at, outbox_id)
    WHERE status = 'PENDING' AND last_error IS NOT NULL;

-- +goose Down
DROP INDEX message_outbox_pending_failed_idx;
