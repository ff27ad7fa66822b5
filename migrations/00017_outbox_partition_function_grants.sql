-- The outbox's partition function (outbox_partition,
-- internal/messaging/outbox/migrations): the relays' claim calls it.

-- +goose Up
GRANT EXECUTE ON FUNCTION outbox_partition(text, integer) TO orders_relay;

-- +goose Down
REVOKE EXECUTE ON FUNCTION outbox_partition(text, integer) FROM orders_relay;
