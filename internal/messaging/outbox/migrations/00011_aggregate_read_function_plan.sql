-- outbox_messages_of_aggregate (00007) in plpgsql, which keeps the plan
-- of its query for the session: as a SQL function (SECURITY DEFINER, so
-- never inlined) its query was planned at every call, over every time
-- partition of message_outbox, which with a year of weekly partitions
-- cost the order timeline most of its time (docs/benchmarks.md, "A year
-- of history"). The same query, columns and rights; grants are kept.

-- +goose Up
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox_messages_of_aggregate(p_aggregate_type text, p_aggregate_id text)
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
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, public, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
        -- A header whose value is not a string is none ('').
        SELECT m.outbox_id, m.aggregate_id, m.message_type, m.status, m.attempt_count,
               coalesce(CASE jsonb_typeof(m.headers -> 'app_id') WHEN 'string' THEN m.headers ->> 'app_id' END, ''),
               coalesce(CASE jsonb_typeof(m.headers -> 'correlation_id') WHEN 'string' THEN m.headers ->> 'correlation_id' END, ''),
               coalesce(CASE jsonb_typeof(m.headers -> 'causation_id') WHEN 'string' THEN m.headers ->> 'causation_id' END, ''),
               coalesce(CASE jsonb_typeof(m.headers -> 'traceparent') WHEN 'string' THEN m.headers ->> 'traceparent' END, ''),
               m.created_at, m.updated_at, m.next_attempt_at, m.published_at, coalesce(m.last_error, '')
        FROM public.message_outbox AS m
        WHERE m.aggregate_type = p_aggregate_type AND m.aggregate_id = p_aggregate_id
        ORDER BY m.created_at, m.outbox_id;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox_messages_of_aggregate(p_aggregate_type text, p_aggregate_id text)
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
