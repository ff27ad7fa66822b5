-- outbox_oldest_unpublished() (internal/messaging/outbox/migrations,
-- 00010): the relays' claim calls it.

-- +goose Up
GRANT EXECUTE ON FUNCTION outbox_oldest_unpublished() TO orders_relay;

-- +goose Down
REVOKE EXECUTE ON FUNCTION outbox_oldest_unpublished() FROM orders_relay;
