-- outbox_oldest_unpublished() (00010) no longer looks for the oldest
-- unpublished row among today's (UTC) rows: it returns the oldest one
-- written before today, or the start of today when there is none. The
-- claims use it only as a lower bound on created_at, to skip the time
-- partitions wholly before it (time partitions start at UTC midnight,
-- so today's partition is probed either way), and every unpublished row
-- is at or after it. It used to walk each status's index from its start:
-- while a session holds the xmin horizon, every row claimed or published
-- since leaves an index entry that cannot be removed, and the walk
-- fetched each one's heap tuple, once per claim (docs/benchmarks.md, "A
-- held horizon"). Now it walks only the entries before today.
-- The PUBLISHING rows get an index that leads on created_at (00001's is
-- on claimed_until, which the minimum had to read whole). Building it
-- blocks writes to message_outbox while it reads the table once.
-- Grants are kept (CREATE OR REPLACE).

-- +goose Up
CREATE INDEX message_outbox_publishing_created_idx ON message_outbox (created_at) WHERE status = 'PUBLISHING';

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox_oldest_unpublished()
RETURNS timestamptz
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, public, pg_temp
AS $$
DECLARE
    today timestamptz := date_trunc('day', now(), 'UTC');
BEGIN
    RETURN least(today,
                 (SELECT min(u.created_at) FROM public.message_outbox u WHERE u.status = 'PENDING' AND u.created_at < today),
                 (SELECT min(u.created_at) FROM public.message_outbox u WHERE u.status = 'PUBLISHING' AND u.created_at < today),
                 (SELECT min(u.created_at) FROM public.message_outbox u WHERE u.status = 'FAILED' AND u.created_at < today));
END
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox_oldest_unpublished()
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
DROP INDEX message_outbox_publishing_created_idx;
