-- The log-tailing relay (RELAY_MODE=wal, docs/outbox-relay.md) reads the
-- outbox's INSERTs from the write-ahead log through logical replication:
-- a publication of message_outbox, inserts only (the relay's own status
-- write-backs are updates, and stay out of the stream), and a replication
-- slot the relay creates on its first start.
--
-- Streaming needs wal_level=logical on the server (compose and make dev set
-- it) and the REPLICATION attribute on the relay's role, which whoever
-- makes the role grants (ALTER ROLE ... WITH REPLICATION).
-- The publication itself costs nothing while no slot reads it, and is
-- created whatever the wal_level (PostgreSQL warns that it cannot be used
-- yet).

-- +goose Up
-- +goose StatementBegin
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = 'orders_outbox') THEN
        CREATE PUBLICATION orders_outbox FOR TABLE message_outbox WITH (publish = 'insert');
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP PUBLICATION IF EXISTS orders_outbox;
