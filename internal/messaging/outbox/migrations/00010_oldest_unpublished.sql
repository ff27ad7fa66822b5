-- outbox_oldest_unpublished() is when the oldest row not yet PUBLISHED
-- (PENDING, PUBLISHING or FAILED) was written, or NULL when there is none.
-- The claims' earlier-row check (ClaimOutbox) looks no further back: with
-- a year of weekly time partitions of published rows, it probes the few
-- partitions from there on instead of every one, and the claim's plan
-- holds no more than a call. Each status has a partial index (00001,
-- 00008), so it costs an index probe or two per time partition, once per
-- claim; plpgsql keeps the plans of its three queries for the session,
-- behind a pooler too.
--
-- SECURITY INVOKER: it reads with the caller's rights, which a relay
-- has; its search_path is fixed, pg_temp last. The service's migrations
-- grant EXECUTE (to the relays'); nobody else may call it.

-- +goose Up
-- +goose StatementBegin
CREATE FUNCTION outbox_oldest_unpublished()
RETURNS timestamptz
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, public, pg_temp
AS $$
BEGIN
    RETURN least((SELECT min(u.created_at) FROM public.message_outbox u WHERE u.status = 'PENDING'),
                 (SELECT min(u.created_at) FROM public.message_outbox u WHERE u.status = 'PUBLISHING'),
                 (SELECT min(u.created_at) FROM public.message_outbox u WHERE u.status = 'FAILED'));
END
$$;
-- +goose StatementEnd
REVOKE EXECUTE ON FUNCTION outbox_oldest_unpublished() FROM PUBLIC;

-- +goose Down
DROP FUNCTION outbox_oldest_unpublished();
