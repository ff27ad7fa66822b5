-- The read functions bounded by time (outbox migration 00013, inbox
-- migration 00006), for the roles granted the unbounded ones (00020): the
-- order timeline reads through them from the order's creation on.

-- +goose Up
GRANT EXECUTE ON FUNCTION outbox_messages_of_aggregate_since(text, text, timestamptz),
    inbox_rows_of_aggregate_since(text, timestamptz) TO orders_api, orders_operator;

-- +goose Down
REVOKE EXECUTE ON FUNCTION outbox_messages_of_aggregate_since(text, text, timestamptz),
    inbox_rows_of_aggregate_since(text, timestamptz) FROM orders_api, orders_operator;
