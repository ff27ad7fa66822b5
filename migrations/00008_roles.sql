-- One PostgreSQL role per process, each granted only what its process's
-- statements need, table by table and, where a table is shared, column by
-- column (docs/security.md has the matrix and the reason for each grant):
--
--   orders_api       order-api: orders, their items and history, idempotency
--                    keys; writes its messages to the outbox; reads nothing
--                    of the outbox or the inbox but what the /ui/ timeline
--                    shows of one order, through two functions.
--   orders_relay     outbox-relay: message_outbox, nothing else.
--   orders_consumer  order-consumer: the inbox, the consumers' own tables,
--                    the guarded status changes of orders; writes its
--                    follow-up messages to the outbox.
--   orders_operator  orderctl and the walkthrough: reads everything; writes
--                    only what orderctl writes (an outbox retry, retention,
--                    its audit rows).
--
-- The schema's owner is whoever runs the migrations (orders_migrate in
-- docker compose, the superuser of a local server): it alone creates,
-- alters and drops tables, and no process connects as it.
--
-- Roles belong to the server, grants to one database. Several databases of
-- one server (the tests make many at once) may run this migration together,
-- so a role another session created in the meantime is fine, and the down
-- migration never drops a role (it revokes, and drops this database's
-- functions): other databases may still grant to the roles.
-- Roles that exist already (docker compose creates them with passwords in
-- deploy/postgres/initdb/) are left as they are, so applying this needs
-- CREATEROLE only on a server that has not got them yet.
--
-- A role created here can log in but has no password: it can connect only
-- where pg_hba.conf trusts it (a local development server, the tests), and
-- nowhere that asks for a password until an administrator sets one (ALTER
-- ROLE ... PASSWORD), which keeps secrets out of the migrations.
--
-- Identity columns (order_state_transition, operator_audit) need no grant on
-- their sequences: PostgreSQL draws their values without checking sequence
-- privileges, so no role is given any. An INSERT ... ON CONFLICT (columns)
-- needs SELECT on those columns, hence the narrow SELECT grants beside some
-- inserts. LISTEN, NOTIFY (the outbox trigger) and advisory locks need no
-- grant. New tables are granted nothing by default: every migration that
-- adds one decides, and migrations/roles_test.go fails until it has. The
-- same test covers every function of the schema: PostgreSQL lets PUBLIC
-- execute a new function unless its migration revokes that.

-- +goose Up
-- +goose StatementBegin
DO $$
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['orders_api', 'orders_relay', 'orders_consumer', 'orders_operator'] LOOP
        IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = r) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I LOGIN', r);
            EXCEPTION WHEN duplicate_object OR unique_violation THEN
                NULL; -- another session created it since the check
            END;
        END IF;
    END LOOP;
END
$$;
-- +goose StatementEnd

GRANT USAGE ON SCHEMA public TO orders_api, orders_relay, orders_consumer, orders_operator;

-- order-api -----------------------------------------------------------------
-- Creates orders (CreateOrder), reads and lists them, cancels them
-- (MoveOrder). The timestamps and the history's ids are the defaults'.
GRANT SELECT ON orders TO orders_api;
GRANT INSERT (order_id, customer_id, currency, status, version, total_cents) ON orders TO orders_api;
GRANT UPDATE (status, version, updated_at) ON orders TO orders_api;
GRANT SELECT, INSERT ON order_items TO orders_api;
GRANT SELECT ON order_state_transition TO orders_api;
GRANT INSERT (order_id, from_status, to_status, message_id, correlation_id, created_at) ON order_state_transition TO orders_api;
-- Idempotency-Key: claim (an upsert), read, complete, and its retention.
GRANT SELECT, DELETE ON http_idempotency_key TO orders_api;
GRANT INSERT (request_method, request_path, idempotency_key, request_hash) ON http_idempotency_key TO orders_api;
GRANT UPDATE (request_hash, response_status, response_body, response_location, created_at) ON http_idempotency_key TO orders_api;
-- Its messages, written in the transaction of the change; the relay's
-- columns (status, claims, attempts) keep their defaults.
GRANT INSERT (outbox_id, aggregate_type, aggregate_id, message_type, message_version, exchange_name, routing_key, payload, headers)
    ON message_outbox TO orders_api;
-- The /ui/ timeline of an order reads its outbox and inbox rows through
-- order_timeline_outbox and order_timeline_inbox (below), and its
-- notifications directly. The API has no SELECT on either message table.
GRANT SELECT ON customer_notification TO orders_api;

-- The /ui/ timeline of an order (internal/timeline) -------------------------
-- What became of one order's messages, for order-api, which has no SELECT
-- on either table: the columns the page shows of the order's outbox rows
-- ('order' is domain.AggregateOrder) and of the consumers' inbox rows about
-- it; never a payload, a payload hash, routing, the relays' claims, the
-- inbox's correlation and causation ids, or a header other than the four
-- shown (headers may also carry tracestate and baggage). The API cannot
-- list, count or search either table, only ask for one order's rows.
--
-- SECURITY DEFINER, so they read as their owner (whoever runs the
-- migrations), which is safe here because:
--   - each is one fixed SELECT, no dynamic SQL, and takes nothing from the
--     caller but an order id, a uuid, compared with aggregate_id;
--   - search_path is fixed, with pg_temp last, and the tables are named
--     with their schema, so a caller's temporary table or a function it
--     made cannot stand in for the ones meant (orders_api cannot create
--     anything in public);
--   - they return one order's rows and the columns listed, STABLE and
--     read-only: nothing the API did not already show of an order on its
--     /ui/ page, which reads the order (and answers 404 for a missing one)
--     before it calls them. order-api has no per-user authorisation: who
--     can reach /ui/ may see any order's timeline, and so may order-api's
--     role; what it can no longer do is read the tables whole.
-- EXECUTE is revoked from PUBLIC (PostgreSQL grants it by default) and
-- granted to orders_api only: orderctl and the walkthrough read the tables
-- themselves, as orders_operator.
-- +goose StatementBegin
CREATE FUNCTION order_timeline_outbox(p_order_id uuid)
RETURNS TABLE (
    outbox_id       uuid,
    message_type    text,
    status          text,
    attempt_count   integer,
    producer        text, -- the headers' app_id
    correlation_id  text,
    causation_id    text,
    traceparent     text,
    created_at      timestamptz,
    updated_at      timestamptz,
    next_attempt_at timestamptz,
    published_at    timestamptz,
    last_error      text
)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, public, pg_temp
AS $$
    -- A header whose value is not a string is none (NULL), as the timeline
    -- has always shown it.
    SELECT m.outbox_id, m.message_type, m.status, m.attempt_count,
           CASE jsonb_typeof(m.headers -> 'app_id') WHEN 'string' THEN m.headers ->> 'app_id' END,
           CASE jsonb_typeof(m.headers -> 'correlation_id') WHEN 'string' THEN m.headers ->> 'correlation_id' END,
           CASE jsonb_typeof(m.headers -> 'causation_id') WHEN 'string' THEN m.headers ->> 'causation_id' END,
           CASE jsonb_typeof(m.headers -> 'traceparent') WHEN 'string' THEN m.headers ->> 'traceparent' END,
           m.created_at, m.updated_at, m.next_attempt_at, m.published_at, m.last_error
    FROM public.message_outbox AS m
    WHERE m.aggregate_type = 'order' AND m.aggregate_id = p_order_id::text
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION order_timeline_inbox(p_order_id uuid)
RETURNS TABLE (
    consumer_name      text,
    message_id         text,
    message_type       text,
    status             text,
    outcome            text,
    outcome_reason     text,
    attempt_count      integer,
    first_received_at  timestamptz,
    last_received_at   timestamptz,
    processed_at       timestamptz,
    last_error_code    text,
    last_error_message text,
    trace_id           text
)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, public, pg_temp
AS $$
    SELECT i.consumer_name, i.message_id, i.message_type, i.status, i.outcome, i.outcome_reason, i.attempt_count,
           i.first_received_at, i.last_received_at, i.processed_at, i.last_error_code, i.last_error_message, i.trace_id
    FROM public.message_inbox AS i
    WHERE i.aggregate_id = p_order_id::text
$$;
-- +goose StatementEnd

REVOKE EXECUTE ON FUNCTION order_timeline_outbox(uuid), order_timeline_inbox(uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION order_timeline_outbox(uuid), order_timeline_inbox(uuid) TO orders_api;

-- outbox-relay --------------------------------------------------------------
-- Claims, marks, releases and recovers rows, reports the backlog, deletes
-- published rows after RELAY_RETENTION. Nothing but the outbox.
GRANT SELECT, DELETE ON message_outbox TO orders_relay;
GRANT UPDATE (status, attempt_count, next_attempt_at, claimed_by, claimed_until, published_at, last_error, updated_at)
    ON message_outbox TO orders_relay;

-- order-consumer ------------------------------------------------------------
-- The inbox is the consumers' own: every step of a delivery, its stats and
-- its retention.
GRANT SELECT, INSERT, UPDATE, DELETE ON message_inbox TO orders_consumer;
-- Fulfillment moves orders with a guarded UPDATE (store.MoveOrder) and
-- records the move; it never reads an order's customer or amounts.
GRANT SELECT (order_id, status, version, created_at, updated_at) ON orders TO orders_consumer;
GRANT UPDATE (status, version, updated_at) ON orders TO orders_consumer;
GRANT SELECT (order_id, message_id) ON order_state_transition TO orders_consumer;
GRANT INSERT (order_id, from_status, to_status, message_id, correlation_id) ON order_state_transition TO orders_consumer;
-- Follow-up messages (inbox.Applied(msg...)).
GRANT INSERT (outbox_id, aggregate_type, aggregate_id, message_type, message_version, exchange_name, routing_key, payload, headers)
    ON message_outbox TO orders_consumer;
-- The consumers' tables. warehouse and notification create, lock and update
-- their rows; shipping only inserts (ON CONFLICT (order_id) reads order_id).
GRANT SELECT, INSERT ON stock_reservation TO orders_consumer;
GRANT UPDATE (status, updated_at) ON stock_reservation TO orders_consumer;
GRANT SELECT, INSERT ON customer_notification TO orders_consumer;
GRANT UPDATE (status, attempt_count, last_error, sent_at) ON customer_notification TO orders_consumer;
GRANT SELECT (order_id) ON shipment TO orders_consumer;
GRANT INSERT (shipment_id, order_id, status, message_id) ON shipment TO orders_consumer;

-- orderctl, the walkthrough -------------------------------------------------
-- Operators look at everything.
GRANT SELECT ON orders, order_items, order_state_transition, message_outbox, message_inbox,
    http_idempotency_key, stock_reservation, customer_notification, shipment, operator_audit
    TO orders_operator;
-- orderctl outbox retry (outbox.RetryFailed): FAILED rows back to PENDING.
GRANT UPDATE (status, attempt_count, next_attempt_at, updated_at) ON message_outbox TO orders_operator;
-- orderctl retention: the services' own retention deletes, run now.
GRANT DELETE ON message_outbox, message_inbox, http_idempotency_key TO orders_operator;
-- Every command that changes something writes its audit row.
GRANT INSERT (actor, action, target, reason, details) ON operator_audit TO orders_operator;

-- Nobody calls the outbox's trigger function: a trigger runs it without
-- checking EXECUTE, and calling it any other way is an error anyway.
REVOKE EXECUTE ON FUNCTION message_outbox_notify() FROM PUBLIC;

-- +goose Down
-- The roles stay, other databases of the server may use them: drop the
-- functions, give the trigger function back PostgreSQL's default, revoke.
GRANT EXECUTE ON FUNCTION message_outbox_notify() TO PUBLIC;
DROP FUNCTION order_timeline_inbox(uuid);
DROP FUNCTION order_timeline_outbox(uuid);
REVOKE ALL ON ALL TABLES IN SCHEMA public FROM orders_api, orders_relay, orders_consumer, orders_operator;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA public FROM orders_api, orders_relay, orders_consumer, orders_operator;
REVOKE USAGE ON SCHEMA public FROM orders_api, orders_relay, orders_consumer, orders_operator;
