-- One aggregate's messages, for a role that may not read message_outbox
-- (outboxadmin.Aggregate reads through it, whatever the role). The
-- service grants EXECUTE to the roles it chooses; nobody else may call it.
-- It shows what the read model shows (outboxadmin.Message): never a
-- payload, routing or a relay's claim, and of the headers only the four
-- named. It cannot list, count or search the table: one aggregate, named
-- by type and id, is all a caller gets.
--
-- SECURITY DEFINER, so it reads as its owner (whoever runs the
-- migrations), which is safe here because it is one fixed SELECT, with no
-- dynamic SQL, of two text arguments compared with the key; its
-- search_path is fixed, pg_temp last, and the table is named with its
-- schema, so a caller's temporary table or function cannot stand in for
-- it; and it is STABLE and read-only.

-- +goose Up
-- +goose StatementBegin
CREATE FUNCTION outbox_messages_of_aggregate(p_aggregate_type text, p_aggregate_id text)
RETURNS TABLE (
    outbox_id       uuid,
    aggregate_id    text,
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
    -- A header whose value is not a string is none ('').
    SELECT m.outbox_id, m.aggregate_id, m.message_type, m.status, m.attempt_count,
           coalesce(CASE jsonb_typeof(m.headers -> 'app_id') WHEN 'string' THEN m.headers ->> 'app_id' END, ''),
           coalesce(CASE jsonb_typeof(m.headers -> 'correlation_id') WHEN 'string' THEN m.headers ->> 'correlation_id' END, ''),
           coalesce(CASE jsonb_typeof(m.headers -> 'causation_id') WHEN 'string' THEN m.headers ->> 'causation_id' END, ''),
           coalesce(CASE jsonb_typeof(m.headers -> 'traceparent') WHEN 'string' THEN m.headers ->> 'traceparent' END, ''),
           m.created_at, m.updated_at, m.next_attempt_at, m.published_at, coalesce(m.last_error, '')
    FROM public.message_outbox AS m
    WHERE m.aggregate_type = p_aggregate_type AND m.aggregate_id = p_aggregate_id
    ORDER BY m.created_at, m.outbox_id
$$;
-- +goose StatementEnd
REVOKE EXECUTE ON FUNCTION outbox_messages_of_aggregate(text, text) FROM PUBLIC;

-- +goose Down
DROP FUNCTION outbox_messages_of_aggregate(text, text);
