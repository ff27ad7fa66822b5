-- The relays' presence (outbox_relay, internal/messaging/outbox/migrations):
-- outbox-relay announces itself, renews and removes its row; operators
-- look at who is there.

-- +goose Up
GRANT SELECT, INSERT, UPDATE, DELETE ON outbox_relay TO orders_relay;
GRANT SELECT ON outbox_relay TO orders_operator;

-- +goose Down
REVOKE ALL ON outbox_relay FROM orders_relay, orders_operator;
