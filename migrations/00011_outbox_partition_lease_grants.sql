-- The relays' leases of the outbox's partitions (outbox_partition_lease,
-- internal/messaging/outbox/migrations): outbox-relay takes, renews and
-- gives them back; operators look at who holds which.

-- +goose Up
GRANT SELECT, INSERT, UPDATE, DELETE ON outbox_partition_lease TO orders_relay;
GRANT SELECT ON outbox_partition_lease TO orders_operator;

-- +goose Down
REVOKE ALL ON outbox_partition_lease FROM orders_relay, orders_operator;
