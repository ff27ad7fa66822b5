-- An outbox row's created_at is the time of its INSERT, not of its
-- transaction's start. The relay publishes the messages of one aggregate
-- in created_at order; two transactions that write messages of one order
-- each lock the order's row first (a guarded update), so the second one's
-- INSERT comes after the first one's commit. With now() (the start of the
-- transaction), a cancel whose transaction began first but waited for the
-- order's row could be stamped before the fulfillment request it followed.

-- +goose Up
ALTER TABLE message_outbox ALTER COLUMN created_at SET DEFAULT clock_timestamp();

-- +goose Down
ALTER TABLE message_outbox ALTER COLUMN created_at SET DEFAULT now();
