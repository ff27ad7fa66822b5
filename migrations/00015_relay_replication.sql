-- The log-tailing relay (RELAY_MODE=wal, docs/outbox-relay.md) streams the
-- outbox's publication (internal/messaging/outbox/migrations) through
-- logical replication, which needs the REPLICATION attribute on its role.
--
-- Only a superuser may grant that attribute: when the migrations run as one
-- (compose, make dev, the tests), this migration grants it; otherwise it
-- says so, and a DBA runs `ALTER ROLE orders_relay WITH REPLICATION` once.

-- +goose Up
-- +goose StatementBegin
DO $$
BEGIN
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
