-- One order's messages, for the roles that show them: order-api's /ui/
-- timeline (which has no SELECT on either message table) and orderctl.
-- The mechanisms' own read functions (outbox migration 00007, inbox
-- migration 00002) take the place of order_timeline_outbox and
-- order_timeline_inbox (00008), which knew the order service inside the
-- mechanisms' tables; docs/security.md says what each shows.

-- +goose Up
GRANT EXECUTE ON FUNCTION outbox_messages_of_aggregate(text, text), inbox_rows_of_aggregate(text) TO orders_api, orders_operator;
DROP FUNCTION order_timeline_outbox(uuid);
DROP FUNCTION order_timeline_inbox(uuid);

-- +goose Down
REVOKE EXECUTE ON FUNCTION outbox_messages_of_aggregate(text, text), inbox_rows_of_aggregate(text) FROM orders_api, orders_operator;
-- +goose StatementBegin
CREATE FUNCTION order_timeline_outbox(p_order_id uuid)
RETURNS TABLE (
    outbox_id uuid, message_type text, status text, attempt_count integer, producer text,
    correlation_id text, causation_id text, traceparent text, created_at timestamptz,
    updated_at timestamptz, next_attempt_at timestamptz, published_at timestamptz, last_error text
)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, public, pg_temp
AS $$
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
    consumer_name text, message_id text, message_type text, status text, outcome text,
    outcome_reason text, attempt_count integer, first_received_at timestamptz, last_received_at timestamptz,
    processed_at timestamptz, last_error_code text, last_error_message text, trace_id text
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
