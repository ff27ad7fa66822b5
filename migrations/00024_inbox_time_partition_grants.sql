-- The inbox's time partitions (internal/messaging/inbox/migrations,
-- 00004): the consumers make them ahead and run retention, which drops
-- them; orderctl lists them (status) and runs retention.

-- +goose Up
GRANT EXECUTE ON FUNCTION inbox_create_time_partitions(text, integer) TO orders_consumer;
GRANT EXECUTE ON FUNCTION inbox_time_partitions(interval, boolean) TO orders_consumer, orders_operator;

-- +goose Down
REVOKE EXECUTE ON FUNCTION inbox_time_partitions(interval, boolean) FROM orders_consumer, orders_operator;
REVOKE EXECUTE ON FUNCTION inbox_create_time_partitions(text, integer) FROM orders_consumer;
