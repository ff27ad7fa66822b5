-- The outbox trigger's NOTIFY names the aggregates of the rows its
-- statement inserted, so that a relay sharing the outbox by partition
-- wakes only for rows of its partitions (listen.go): the payload is
-- 'h:' and each aggregate's hashtext(aggregate_id), '*' and its row count
-- when above one, comma-separated, ascending; outbox_partition is
-- mod(hash + 2^31, partitions) for any partition count. Over 64
-- aggregates it is '' (the old constant payload: every relay wakes), so
-- it stays under 1,500 bytes (the limit is 8,000). A statement that
-- inserted nothing notifies nothing. A relay of the previous version
-- ignores the payload; this one wakes for '' and anything it cannot read.
-- The function keeps its name, so its grants stay (the service's
-- migrations); hashtext is built in, which every writer may call.

-- +goose Up
DROP TRIGGER message_outbox_notify ON message_outbox;
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION message_outbox_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('message_outbox', CASE WHEN count(*) <= 64
        THEN 'h:' || string_agg(CASE WHEN a.n = 1 THEN a.h::text ELSE a.h || '*' || a.n END, ',' ORDER BY a.h)
        ELSE '' END)
    FROM (SELECT hashtext(r.aggregate_id) AS h, count(*) AS n FROM new_rows r GROUP BY 1) a
    HAVING count(*) > 0;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd
CREATE TRIGGER message_outbox_notify
    AFTER INSERT ON message_outbox
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION message_outbox_notify();

-- +goose Down
DROP TRIGGER message_outbox_notify ON message_outbox;
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION message_outbox_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('message_outbox', '');
    RETURN NULL;
END;
$$;
-- +goose StatementEnd
CREATE TRIGGER message_outbox_notify
    AFTER INSERT ON message_outbox
    FOR EACH STATEMENT EXECUTE FUNCTION message_outbox_notify();
