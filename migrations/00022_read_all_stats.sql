-- The relays, the consumers and orderctl report the age of the oldest
-- transaction horizon holder (internal/messaging/tablestats): the session
-- holding it is most often another process's, and PostgreSQL shows the
-- transaction start and state of another role's session only to members of
-- pg_read_all_stats. The membership also shows them other sessions'
-- statement texts (pgx sends parameters apart from them) and the server's
-- statistics views; it grants no access to any table.
--
-- Granting a predefined role needs a superuser, or ADMIN OPTION on it:
-- when the migrations run as neither (docker compose's orders_migrate;
-- its deploy/postgres/initdb/10-roles.sh grants it at the volume's first
-- start), this says what a DBA runs, once.

-- +goose Up
-- +goose StatementBegin
DO $$
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['orders_relay', 'orders_consumer', 'orders_operator'] LOOP
        -- Membership belongs to the whole server: another database's
        -- migration may grant it at the same moment (the loser fails with
        -- a unique violation, or "tuple concurrently updated"), so grant
        -- only when missing and, after an error, look again.
        CONTINUE WHEN EXISTS (SELECT FROM pg_auth_members
                              WHERE roleid = 'pg_read_all_stats'::regrole AND member = r::regrole);
        BEGIN
            EXECUTE format('GRANT pg_read_all_stats TO %I', r);
        EXCEPTION
            WHEN insufficient_privilege THEN
                RAISE WARNING '% cannot grant pg_read_all_stats: a superuser runs GRANT pg_read_all_stats TO %, so that its process sees what holds the transaction horizon', current_user, r;
            WHEN unique_violation OR internal_error THEN
                IF NOT EXISTS (SELECT FROM pg_auth_members
                               WHERE roleid = 'pg_read_all_stats'::regrole AND member = r::regrole) THEN
                    RAISE;
                END IF;
        END;
    END LOOP;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- Nothing: other databases of the server may rely on the membership.
