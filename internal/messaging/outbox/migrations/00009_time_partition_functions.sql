-- The time partitions of message_outbox (00008): made ahead, dropped by
-- retention. Only the table's owner may make or drop a partition, so the
-- relays and orderctl do it through these functions, which run as their
-- owner (whoever runs the migrations; the service's migrations grant
-- EXECUTE). Each is fixed SQL whose only dynamic part is a partition's
-- name and bounds, quoted with format(); its search_path is fixed,
-- pg_temp last.
--
-- outbox_create_time_partitions(period, ahead) makes partitions of one
-- period each ('day', or 'week' from Monday, UTC), from the end of the
-- last one until they reach ahead periods past now, and returns where the
-- last one ends. No DEFAULT partition: a row in it would forbid making the
-- partition its time belongs to; instead the relays keep several periods
-- made ahead, and say when the last one nears (outbox.time_partitions.horizon).
-- Several relays may call it at once: they queue on an advisory lock, and
-- the later ones find the partitions made.
--
-- outbox_time_partitions(retention, drop) lists the partitions. A
-- partition past retention (it ends retention or longer ago) is held while
-- any row of it is not PUBLISHED (PENDING, PUBLISHING, FAILED) or was
-- published within retention: held_rows counts them. With drop, each
-- partition past retention and holding none is detached and dropped,
-- counted again once detached (nobody can write to it then), and dropped
-- is true. Detaching waits at most lock_timeout for the table: a
-- long transaction on it makes the call fail, and the next one retries.

-- +goose Up
-- +goose StatementBegin
CREATE FUNCTION outbox_time_partition_bounds()
RETURNS TABLE (partition_name text, range_start timestamptz, range_end timestamptz)
LANGUAGE sql STABLE
SET search_path = pg_catalog, public, pg_temp
SET timezone = 'UTC'
AS $$
    SELECT c.relname::text,
           substring(pg_get_expr(c.relpartbound, c.oid) FROM 'FROM \(''([^'']+)''\)')::timestamptz,
           substring(pg_get_expr(c.relpartbound, c.oid) FROM 'TO \(''([^'']+)''\)')::timestamptz
    FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
    WHERE i.inhparent = 'public.message_outbox'::regclass
    ORDER BY 3
$$;
-- +goose StatementEnd
REVOKE EXECUTE ON FUNCTION outbox_time_partition_bounds() FROM PUBLIC;

-- +goose StatementBegin
CREATE FUNCTION outbox_create_time_partitions(p_period text, p_ahead integer)
RETURNS timestamptz
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, public, pg_temp
SET timezone = 'UTC'
SET lock_timeout = '5s'
AS $$
DECLARE
    step interval := CASE p_period WHEN 'day' THEN interval '24 hours' WHEN 'week' THEN interval '168 hours' END;
    upper timestamptz;
    next timestamptz;
BEGIN
    IF step IS NULL OR p_ahead < 1 THEN
        RAISE EXCEPTION 'time partitions: period % (want day or week), % ahead (want 1 or more)', p_period, p_ahead;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtext('message_outbox time partitions'));
    SELECT max(b.range_end) INTO upper FROM outbox_time_partition_bounds() b;
    upper := coalesce(upper, date_trunc(p_period, now()));
    WHILE upper < now() + p_ahead * step LOOP
        next := date_trunc(p_period, upper) + step;
        EXECUTE format('CREATE TABLE IF NOT EXISTS public.%I PARTITION OF public.message_outbox FOR VALUES FROM (%L) TO (%L)',
            'message_outbox_p' || to_char(upper, 'YYYYMMDD'), upper, next);
        upper := next;
    END LOOP;
    RETURN upper;
END
$$;
-- +goose StatementEnd
REVOKE EXECUTE ON FUNCTION outbox_create_time_partitions(text, integer) FROM PUBLIC;

-- +goose StatementBegin
CREATE FUNCTION outbox_time_partitions(p_retention interval, p_drop boolean)
RETURNS TABLE (partition_name text, range_start timestamptz, range_end timestamptz,
               past_retention boolean, held_rows bigint, dropped boolean)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, public, pg_temp
SET timezone = 'UTC'
SET lock_timeout = '2s'
AS $$
DECLARE
    cutoff timestamptz := now() - p_retention;
    -- One count per partial index of 00001 (the statuses but PUBLISHED,
    -- and those published since the cutoff), so as not to read the rest.
    held text := 'SELECT (SELECT count(*) FROM public.%1$I WHERE status = ''PENDING'')'
              || ' + (SELECT count(*) FROM public.%1$I WHERE status = ''PUBLISHING'')'
              || ' + (SELECT count(*) FROM public.%1$I WHERE status = ''FAILED'')'
              || ' + (SELECT count(*) FROM public.%1$I WHERE status = ''PUBLISHED'' AND published_at >= %2$L)';
BEGIN
    FOR partition_name, range_start, range_end IN SELECT * FROM outbox_time_partition_bounds() LOOP
        past_retention := p_retention > interval '0' AND range_end <= cutoff;
        held_rows := 0;
        dropped := false;
        IF past_retention THEN
            EXECUTE format(held, partition_name, cutoff) INTO held_rows;
            IF p_drop AND held_rows = 0 THEN
                EXECUTE format('ALTER TABLE public.message_outbox DETACH PARTITION public.%I', partition_name);
                EXECUTE format(held, partition_name, cutoff) INTO held_rows;
                IF held_rows > 0 THEN
                    RAISE EXCEPTION 'time partition % took % unfinished rows while it was detached', partition_name, held_rows;
                END IF;
                EXECUTE format('DROP TABLE public.%I', partition_name);
                dropped := true;
            END IF;
        END IF;
        RETURN NEXT;
    END LOOP;
END
$$;
-- +goose StatementEnd
REVOKE EXECUTE ON FUNCTION outbox_time_partitions(interval, boolean) FROM PUBLIC;

-- The first weeks' partitions, after message_outbox_initial (00008): the
-- relays keep making them from there.
SELECT outbox_create_time_partitions('week', 4);

-- +goose Down
DROP FUNCTION outbox_time_partitions(interval, boolean);
DROP FUNCTION outbox_create_time_partitions(text, integer);
DROP FUNCTION outbox_time_partition_bounds();
