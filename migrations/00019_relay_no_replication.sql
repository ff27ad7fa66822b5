-- The polling relay's role keeps no REPLICATION. 00015 gave orders_relay
-- the attribute, when the migrations ran as a superuser, for the
-- log-tailing relay; but a role with it can create a logical slot of its
-- own (any output plugin) and read every row of every table through it,
-- whatever its grants, so orders_relay could read orders and the inbox.
-- The log-tailing relay streams as a role of its own now,
-- orders_relay_wal, which migrate makes only when asked
-- (MIGRATE_RELAY_WAL_ROLE, docs/security.md#replication).
--
-- Only a superuser may take the attribute away: otherwise, when the role
-- has it, this says so, and a DBA runs ALTER ROLE orders_relay
-- NOREPLICATION once.

-- +goose Up
-- +goose StatementBegin
DO $$
BEGIN
    IF NOT (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN
        IF (SELECT rolreplication FROM pg_roles WHERE rolname = 'orders_relay') THEN
            RAISE WARNING 'orders_relay has REPLICATION, which lets it read every table: a superuser runs ALTER ROLE orders_relay NOREPLICATION';
        END IF;
        RETURN;
    END IF;
    -- A role belongs to the whole server: other databases' migrations may
    -- change it at the same moment (00015 grants, this revokes), and the
    -- loser of two concurrent ALTER ROLEs fails with "tuple concurrently
    -- updated" (internal_error). Look again and retry until the role has
    -- no REPLICATION.
    FOR try IN 1..20 LOOP
        EXIT WHEN NOT (SELECT rolreplication FROM pg_roles WHERE rolname = 'orders_relay');
        BEGIN
            ALTER ROLE orders_relay WITH NOREPLICATION;
        EXCEPTION WHEN internal_error THEN
            IF try = 20 THEN
                RAISE;
            END IF;
        END;
    END LOOP;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- Nothing: the attribute is not given back.
