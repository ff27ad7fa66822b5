-- inbox_rows_of_aggregate_since: inbox_rows_of_aggregate (00005) with a
-- lower bound on first_received_at, for a caller that knows no message of
-- the aggregate was received before p_since (the order timeline: none
-- before its order). The bound lets PostgreSQL skip, at run time, every
-- time partition that ends before it, instead of probing the aggregate
-- index of each (docs/benchmarks.md, "A year of history"). The same
-- columns, order and rights as 00005; plpgsql, so that its plan is kept
-- for the session.

-- +goose Up
-- +goose StatementBegin
CREATE FUNCTION inbox_rows_of_aggregate_since(p_aggregate_id text, p_since timestamptz)
RETURNS TABLE (
    consumer_name         text,
    message_id            text,
    message_type          text,
    message_version       integer,
    aggregate_id          text,
    status                text,
    outcome               text,
    outcome_reason        text,
    attempt_count         integer,
    first_received_at     timestamptz,
    last_received_at      timestamptz,
    processing_started_at timestamptz,
    processed_at          timestamptz,
    last_error_code       text,
    last_error_message    text,
    correlation_id        text,
    causation_id          text,
    trace_id              text
)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, public, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
        SELECT i.consumer_name, i.message_id, i.message_type, i.message_version, i.aggregate_id, i.status,
               i.outcome, i.outcome_reason, i.attempt_count, i.first_received_at, i.last_received_at,
               i.processing_started_at, i.processed_at, i.last_error_code, i.last_error_message,
               i.correlation_id, i.causation_id, i.trace_id
        FROM public.message_inbox AS i
        WHERE i.aggregate_id = p_aggregate_id AND i.first_received_at >= p_since
        ORDER BY i.first_received_at, i.consumer_name, i.message_id;
END
$$;
-- +goose StatementEnd
REVOKE EXECUTE ON FUNCTION inbox_rows_of_aggregate_since(text, timestamptz) FROM PUBLIC;

-- +goose Down
DROP FUNCTION inbox_rows_of_aggregate_since(text, timestamptz);
