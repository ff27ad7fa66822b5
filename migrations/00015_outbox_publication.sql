-- The log-tailing relay (RELAY_MODE=wal, docs/outbox-relay.md) reads the
-- outbox's INSERTs from the write-ahead log through logical replication:
-- a publication of message_outbox, inserts only (the relay's own status
-- write-backs are updates, and stay out of the stream), and a replication
-- slot the relay creates on its first start.
--
-- Streaming needs wal_level=logical on the server (compose and make dev set
-- it) and the REPLICATION attribute on the relay's role. Only a superuser
-- may grant that attribute: when the migrations run as one (compose, make
-- dev, the tests), this migration grants it; otherwise it says so, and a
-- DBA runs `ALTER ROLE orders_relay WITH REPLICATION` once. The
-- publication itself costs nothing while no slot reads it, and is created
-- whatever the wal_level (PostgreSQL warns that it cannot be used yet).

-- +goose Up
-- +goose StatementBegin
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = 'orders_outbox') THEN
        CREATE PUBLICATION orders_outbox FOR TABLE message_outbox WITH (publish = 'insert');
    END IF;
    IF (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN
        -- A role belongs to the whole server: migrations of other databases
        -- may change it at the same moment, and the loser of two concurrent
        -- ALTER ROLEs fails with "tuple concurrently updated" (internal_error)
        -- though the winner's change is committed. Alter only when needed,
        -- and after that error look again.
        IF NOT (SELECT rolreplication FROM pg_roles WHERE rolname = 'orders_relay') THEN
            BEGIN
                ALTER ROLE orders_relay WITH REPLICATION;
            EXCEPTION WHEN internal_error THEN
                IF NOT (SELECT rolreplication FROM pg_roles WHERE rolname = 'orders_relay') THEN
                    RAISE;
                END IF;
            END;
        END IF;
    ELSE
        RAISE NOTICE 'not a superuser: run ALTER ROLE orders_relay WITH REPLICATION for RELAY_MODE=wal';
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
DO $$
BEGIN
    DROP PUBLICATION IF EXISTS orders_outbox;
    IF (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)
       AND (SELECT rolreplication FROM pg_roles WHERE rolname = 'orders_relay') THEN
        BEGIN
            ALTER ROLE orders_relay WITH NOREPLICATION;
        EXCEPTION WHEN internal_error THEN
            IF (SELECT rolreplication FROM pg_roles WHERE rolname = 'orders_relay') THEN
                RAISE;
            END IF;
        END;
    END IF;
END
$$;
-- +goose StatementEnd
