-- inbox_rows_of_aggregate (00002) in plpgsql, which keeps the plan of its
-- query for the session: as a SQL function (SECURITY DEFINER, so never
-- inlined) its query was planned at every call, over every time
-- partition of message_inbox (docs/benchmarks.md, "A year of history").
-- The same query, columns and rights; grants are kept.

-- +goose Up
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION inbox_rows_of_aggregate(p_aggregate_id text)
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
        WHERE i.aggregate_id = p_aggregate_id
        ORDER BY i.first_received_at, i.consumer_name, i.message_id;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION inbox_rows_of_aggregate(p_aggregate_id text)
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
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, public, pg_temp
AS $$
    SELECT i.consumer_name, i.message_id, i.message_type, i.message_version, i.aggregate_id, i.status,
           i.outcome, i.outcome_reason, i.attempt_count, i.first_received_at, i.last_received_at,
           i.processing_started_at, i.processed_at, i.last_error_code, i.last_error_message,
           i.correlation_id, i.causation_id, i.trace_id
    FROM public.message_inbox AS i
    WHERE i.aggregate_id = p_aggregate_id
    ORDER BY i.first_received_at, i.consumer_name, i.message_id
$$;
-- +goose StatementEnd
