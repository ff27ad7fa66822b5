-- outbox_time_partitions (00009) counts the rows that hold the partitions
-- past retention in one statement instead of one dynamic statement per
-- partition, each parsed and planned: with a year of weekly partitions
-- past retention, that cost a retention turn 14 to 20 times its time on
-- an empty table (docs/benchmarks.md, "A year of history"). The statement
-- reads, of the partitions ending at or before the cutoff only
-- (created_at below the latest such end, which prunes the others when it
-- is planned), the partial index of each status not PUBLISHED and the
-- PUBLISHED rows' index from the cutoff on: an index probe each, as
-- before. plpgsql plans it for each call's values: a generic plan, not
-- knowing the cutoff, read every PUBLISHED row (seconds). With drop, a
-- partition holding none is still detached, counted again with the
-- per-partition statement (nobody can write to it then) and dropped. The
-- same arguments, columns and rights.

-- +goose Up
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox_time_partitions(p_retention interval, p_drop boolean)
RETURNS TABLE (partition_name text, range_start timestamptz, range_end timestamptz,
               past_retention boolean, held_rows bigint, dropped boolean)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, public, pg_temp
SET timezone = 'UTC'
SET lock_timeout = '2s'
AS $$
#variable_conflict use_column
DECLARE
    cutoff timestamptz := now() - p_retention;
    names text[];
    starts timestamptz[];
    ends timestamptz[];
    past_end timestamptz;
    held jsonb := '{}';
    -- One count per partial index of 00001, for one partition.
    held_one text := 'SELECT (SELECT count(*) FROM public.%1$I WHERE status = ''PENDING'')'
                  || ' + (SELECT count(*) FROM public.%1$I WHERE status = ''PUBLISHING'')'
                  || ' + (SELECT count(*) FROM public.%1$I WHERE status = ''FAILED'')'
                  || ' + (SELECT count(*) FROM public.%1$I WHERE status = ''PUBLISHED'' AND published_at >= %2$L)';
BEGIN
    SELECT array_agg(x.partition_name ORDER BY x.range_end), array_agg(x.range_start ORDER BY x.range_end),
           array_agg(x.range_end ORDER BY x.range_end)
    INTO names, starts, ends FROM outbox_time_partition_bounds() AS x;
    IF p_retention > interval '0' THEN
        SELECT max(e) INTO past_end FROM unnest(ends) AS e WHERE e <= cutoff;
    END IF;
    IF past_end IS NOT NULL THEN
        SELECT coalesce(jsonb_object_agg(h.part, h.n), '{}') INTO held
        FROM (SELECT u.part::text AS part, count(*) AS n
              FROM (SELECT m.tableoid AS part FROM public.message_outbox m WHERE m.status = 'PENDING' AND m.created_at < past_end
                    UNION ALL
                    SELECT m.tableoid FROM public.message_outbox m WHERE m.status = 'PUBLISHING' AND m.created_at < past_end
                    UNION ALL
                    SELECT m.tableoid FROM public.message_outbox m WHERE m.status = 'FAILED' AND m.created_at < past_end
                    UNION ALL
                    SELECT m.tableoid FROM public.message_outbox m
                    WHERE m.status = 'PUBLISHED' AND m.published_at >= cutoff AND m.created_at < past_end) AS u
              GROUP BY u.part) AS h;
    END IF;
    FOR k IN 1 .. coalesce(array_length(names, 1), 0) LOOP
        partition_name := names[k];
        range_start := starts[k];
        range_end := ends[k];
        past_retention := past_end IS NOT NULL AND range_end <= past_end;
        held_rows := 0;
        dropped := false;
        IF past_retention THEN
            held_rows := coalesce((held ->> (format('public.%I', partition_name)::regclass::oid::text))::bigint, 0);
            IF p_drop AND held_rows = 0 THEN
                EXECUTE format('ALTER TABLE public.message_outbox DETACH PARTITION public.%I', partition_name);
                EXECUTE format(held_one, partition_name, cutoff) INTO held_rows;
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

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox_time_partitions(p_retention interval, p_drop boolean)
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
