-- The time partitions of message_inbox (00003): made ahead by the
-- consumers, dropped by retention, through these functions, which run as
-- their owner (only the table's owner may make or drop a partition); the
-- service's migrations grant EXECUTE. They are the outbox's (its
-- migration 00009 says how they work) for message_inbox: a partition past
-- retention is held while any row of it is not PROCESSED, or was
-- processed within retention.

-- +goose Up
-- +goose StatementBegin
CREATE FUNCTION inbox_time_partition_bounds()
RETURNS TABLE (partition_name text, range_start timestamptz, range_end timestamptz)
LANGUAGE sql STABLE
SET search_path = pg_catalog, public, pg_temp
SET timezone = 'UTC'
AS $$
    SELECT c.relname::text,
           substring(pg_get_expr(c.relpartbound, c.oid) FROM 'FROM \(''([^'']+)''\)')::timestamptz,
           substring(pg_get_expr(c.relpartbound, c.oid) FROM 'TO \(''([^'']+)''\)')::timestamptz
    FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
    WHERE i.inhparent = 'public.message_inbox'::regclass
    ORDER BY 3
$$;
-- +goose StatementEnd
REVOKE EXECUTE ON FUNCTION inbox_time_partition_bounds() FROM PUBLIC;

-- +goose StatementBegin
CREATE FUNCTION inbox_create_time_partitions(p_period text, p_ahead integer)
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
    PERFORM pg_advisory_xact_lock(hashtext('message_inbox time partitions'));
    SELECT max(b.range_end) INTO upper FROM inbox_time_partition_bounds() b;
    upper := coalesce(upper, date_trunc(p_period, now()));
    WHILE upper < now() + p_ahead * step LOOP
        next := date_trunc(p_period, upper) + step;
        EXECUTE format('CREATE TABLE IF NOT EXISTS public.%I PARTITION OF public.message_inbox FOR VALUES FROM (%L) TO (%L)',
            'message_inbox_p' || to_char(upper, 'YYYYMMDD'), upper, next);
        upper := next;
    END LOOP;
    RETURN upper;
END
$$;
-- +goose StatementEnd
REVOKE EXECUTE ON FUNCTION inbox_create_time_partitions(text, integer) FROM PUBLIC;

-- +goose StatementBegin
CREATE FUNCTION inbox_time_partitions(p_retention interval, p_drop boolean)
RETURNS TABLE (partition_name text, range_start timestamptz, range_end timestamptz,
               past_retention boolean, held_rows bigint, dropped boolean)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, public, pg_temp
SET timezone = 'UTC'
SET lock_timeout = '2s'
AS $$
DECLARE
    cutoff timestamptz := now() - p_retention;
    -- One count per partial index of 00001: the rows not PROCESSED, and
    -- those processed since the cutoff.
    held text := 'SELECT (SELECT count(*) FROM public.%1$I WHERE status <> ''PROCESSED'')'
              || ' + (SELECT count(*) FROM public.%1$I WHERE status = ''PROCESSED'' AND processed_at >= %2$L)';
BEGIN
    FOR partition_name, range_start, range_end IN SELECT * FROM inbox_time_partition_bounds() LOOP
        past_retention := p_retention > interval '0' AND range_end <= cutoff;
        held_rows := 0;
        dropped := false;
        IF past_retention THEN
            EXECUTE format(held, partition_name, cutoff) INTO held_rows;
            IF p_drop AND held_rows = 0 THEN
                EXECUTE format('ALTER TABLE public.message_inbox DETACH PARTITION public.%I', partition_name);
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
REVOKE EXECUTE ON FUNCTION inbox_time_partitions(interval, boolean) FROM PUBLIC;

-- The first weeks' partitions, after message_inbox_initial (00003): the
-- consumers keep making them from there.
SELECT inbox_create_time_partitions('week', 4);

-- +goose Down
DROP FUNCTION inbox_time_partitions(interval, boolean);
DROP FUNCTION inbox_create_time_partitions(text, integer);
DROP FUNCTION inbox_time_partition_bounds();
