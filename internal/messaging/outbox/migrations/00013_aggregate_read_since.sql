-- outbox_messages_of_aggregate_since: outbox_messages_of_aggregate (00011)
-- with a lower bound on created_at, for a caller that knows no message of
-- the aggregate was written before p_since (the order timeline: none
-- before its order). The bound lets PostgreSQL skip, at run time, every
-- time partition that ends before it: without it the read probes the
-- aggregate index of every partition, which with a year of weekly ones
-- cost the timeline 5.5 times its time on an empty table
-- (docs/benchmarks.md, "A year of history"). The same columns, order and
-- rights as 00011; plpgsql, so that its plan is kept for the session.

-- +goose Up
-- +goose StatementBegin
CREATE FUNCTION outbox_messages_of_aggregate_since(p_aggregate_type text, p_aggregate_id text, p_since timestamptz)
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
        WHERE m.aggregate_type = p_aggregate_type AND m.aggregate_id = p_aggregate_id AND m.created_at >= p_since
        ORDER BY m.created_at, m.outbox_id;
END
$$;
-- +goose StatementEnd
REVOKE EXECUTE ON FUNCTION outbox_messages_of_aggregate_since(text, text, timestamptz) FROM PUBLIC;

-- +goose Down
DROP FUNCTION outbox_messages_of_aggregate_since(text, text, timestamptz);
