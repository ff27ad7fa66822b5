-- Every consumer's rows of one aggregate, for a role that may not read
-- message_inbox (inboxadmin.Aggregate reads through it, whatever the
-- role). The service grants EXECUTE to the roles it chooses; nobody else
-- may call it. Every column but the payload hash, which only says whether
-- two deliveries carried the same body. It cannot list, count or search
-- the table: one aggregate, named by its id, is all a caller gets.
--
-- SECURITY DEFINER, so it reads as its owner (whoever runs the
-- migrations), which is safe here because it is one fixed SELECT, with no
-- dynamic SQL, of one text argument compared with aggregate_id; its
-- search_path is fixed, pg_temp last, and the table is named with its
-- schema, so a caller's temporary table or function cannot stand in for
-- it; and it is STABLE and read-only.

-- +goose Up
-- +goose StatementBegin
CREATE FUNCTION inbox_rows_of_aggregate(p_aggregate_id text)
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
REVOKE EXECUTE ON FUNCTION inbox_rows_of_aggregate(text) FROM PUBLIC;

-- +goose Down
DROP FUNCTION inbox_rows_of_aggregate(text);
