-- The outbox's time partitions (internal/messaging/outbox/migrations,
-- 00009): the relays make them ahead and run retention, which drops them;
-- orderctl lists them (status) and runs retention.

-- +goose Up
GRANT EXECUTE ON FUNCTION outbox_create_time_partitions(text, integer) TO orders_relay;
GRANT EXECUTE ON FUNCTION outbox_time_partitions(interval, boolean) TO orders_relay, orders_operator;

-- +goose Down
REVOKE EXECUTE ON FUNCTION outbox_time_partitions(interval, boolean) FROM orders_relay, orders_operator;
REVOKE EXECUTE ON FUNCTION outbox_create_time_partitions(text, integer) FROM orders_relay;
