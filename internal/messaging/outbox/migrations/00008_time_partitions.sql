-- message_outbox becomes range-partitioned on created_at: time
-- partitions (not the relays' aggregate partitions of RELAY_PARTITIONS),
-- made ahead by the relays (outbox_create_time_partitions, 00009) and
-- dropped whole by retention. The primary key is (outbox_id, created_at):
-- a partitioned table's unique keys must hold its partition key.
--
-- On a running system: the table as it is becomes the first partition,
-- message_outbox_initial, for every created_at before a bound a day or two
-- ahead (UTC midnight), so new rows keep landing in it until the relays'
-- partitions take over. No row moves, nothing is published again (the
-- log-tailing relay's slot is untouched), and writers wait only for the
-- last step, which reads no row: the bound's CHECK is validated, and the
-- new key's index built, beforehand, while writes go on; ATTACH then
-- trusts the CHECK instead of scanning. The table keeps its privileges,
-- which pass to the partitioned table.
--
-- The publication sends the inserts of every partition as message_outbox
-- (publish_via_partition_root), those of partitions made later too.

-- +goose NO TRANSACTION
-- +goose Up
-- +goose StatementBegin
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conname = 'message_outbox_initial_bound') THEN
        EXECUTE format('ALTER TABLE message_outbox ADD CONSTRAINT message_outbox_initial_bound CHECK (created_at < %L) NOT VALID',
            date_trunc('day', now(), 'UTC') + interval '48 hours');
    END IF;
END
$$;
-- +goose StatementEnd
ALTER TABLE message_outbox VALIDATE CONSTRAINT message_outbox_initial_bound;
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS message_outbox_initial_pkey ON message_outbox (outbox_id, created_at);

-- +goose StatementBegin
DO $$
DECLARE
    bound text := substring(pg_get_constraintdef((SELECT oid FROM pg_constraint WHERE conname = 'message_outbox_initial_bound'))
                            FROM '''([^'']+)''');
    acl record;
BEGIN
    ALTER TABLE message_outbox RENAME TO message_outbox_initial;
    ALTER TABLE message_outbox_initial DROP CONSTRAINT message_outbox_pkey;
    ALTER TABLE message_outbox_initial ADD CONSTRAINT message_outbox_initial_pkey PRIMARY KEY USING INDEX message_outbox_initial_pkey;
    ALTER INDEX message_outbox_pending_idx RENAME TO message_outbox_initial_pending_idx;
    ALTER INDEX message_outbox_publishing_idx RENAME TO message_outbox_initial_publishing_idx;
    ALTER INDEX message_outbox_aggregate_idx RENAME TO message_outbox_initial_aggregate_idx;
    ALTER INDEX message_outbox_published_idx RENAME TO message_outbox_initial_published_idx;
    ALTER INDEX message_outbox_failed_idx RENAME TO message_outbox_initial_failed_idx;
    DROP TRIGGER message_outbox_notify ON message_outbox_initial;

    CREATE TABLE message_outbox (LIKE message_outbox_initial INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
        PARTITION BY RANGE (created_at);
    ALTER TABLE message_outbox DROP CONSTRAINT message_outbox_initial_bound;
    ALTER TABLE message_outbox ADD CONSTRAINT message_outbox_pkey PRIMARY KEY (outbox_id, created_at);
    -- The indexes of 00001, on every partition.
    CREATE INDEX message_outbox_pending_idx ON message_outbox (created_at, outbox_id) WHERE status = 'PENDING';
    CREATE INDEX message_outbox_publishing_idx ON message_outbox (claimed_until) WHERE status = 'PUBLISHING';
    CREATE INDEX message_outbox_aggregate_idx ON message_outbox (aggregate_type, aggregate_id, created_at);
    CREATE INDEX message_outbox_published_idx ON message_outbox (published_at) WHERE status = 'PUBLISHED';
    CREATE INDEX message_outbox_failed_idx ON message_outbox (updated_at) WHERE status = 'FAILED';
    -- Attaches the initial table's indexes to these instead of building.
    EXECUTE format('ALTER TABLE message_outbox ATTACH PARTITION message_outbox_initial FOR VALUES FROM (MINVALUE) TO (%L)', bound);
    ALTER TABLE message_outbox_initial DROP CONSTRAINT message_outbox_initial_bound;
    CREATE TRIGGER message_outbox_notify
        AFTER INSERT ON message_outbox
        FOR EACH STATEMENT EXECUTE FUNCTION message_outbox_notify();

    -- The table's privileges (granted by the service's migrations), table
    -- and columns, pass to the partitioned table; reads and writes go
    -- through it, and a partition needs none of its own.
    FOR acl IN SELECT a.privilege_type, a.grantee::regrole AS grantee FROM pg_class c, aclexplode(c.relacl) a
               WHERE c.oid = 'message_outbox_initial'::regclass AND a.grantee <> c.relowner AND a.grantee <> 0 LOOP
        EXECUTE format('GRANT %s ON message_outbox TO %s', acl.privilege_type, acl.grantee);
        EXECUTE format('REVOKE %s ON message_outbox_initial FROM %s', acl.privilege_type, acl.grantee);
    END LOOP;
    FOR acl IN SELECT a.privilege_type, a.grantee::regrole AS grantee, t.attname FROM pg_attribute t, aclexplode(t.attacl) a
               WHERE t.attrelid = 'message_outbox_initial'::regclass AND a.grantee <> 0 LOOP
        EXECUTE format('GRANT %s (%I) ON message_outbox TO %s', acl.privilege_type, acl.attname, acl.grantee);
        EXECUTE format('REVOKE %s (%I) ON message_outbox_initial FROM %s', acl.privilege_type, acl.attname, acl.grantee);
    END LOOP;

    IF EXISTS (SELECT 1 FROM pg_publication WHERE pubname = 'orders_outbox') THEN
        ALTER PUBLICATION orders_outbox SET TABLE message_outbox;
        ALTER PUBLICATION orders_outbox SET (publish_via_partition_root = true);
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- Back to one table: the rows are copied (writers wait meanwhile).
-- +goose StatementBegin
DO $$
DECLARE
    acl record;
BEGIN
    ALTER TABLE message_outbox RENAME TO message_outbox_partitioned;
    DROP TRIGGER message_outbox_notify ON message_outbox_partitioned;
    CREATE TABLE message_outbox (LIKE message_outbox_partitioned INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
    INSERT INTO message_outbox SELECT * FROM message_outbox_partitioned;
    FOR acl IN SELECT a.privilege_type, a.grantee::regrole AS grantee FROM pg_class c, aclexplode(c.relacl) a
               WHERE c.oid = 'message_outbox_partitioned'::regclass AND a.grantee <> c.relowner AND a.grantee <> 0 LOOP
        EXECUTE format('GRANT %s ON message_outbox TO %s', acl.privilege_type, acl.grantee);
    END LOOP;
    FOR acl IN SELECT a.privilege_type, a.grantee::regrole AS grantee, t.attname FROM pg_attribute t, aclexplode(t.attacl) a
               WHERE t.attrelid = 'message_outbox_partitioned'::regclass AND a.grantee <> 0 LOOP
        EXECUTE format('GRANT %s (%I) ON message_outbox TO %s', acl.privilege_type, acl.attname, acl.grantee);
    END LOOP;
    IF EXISTS (SELECT 1 FROM pg_publication WHERE pubname = 'orders_outbox') THEN
        ALTER PUBLICATION orders_outbox SET (publish_via_partition_root = false);
        ALTER PUBLICATION orders_outbox SET TABLE message_outbox;
    END IF;
    DROP TABLE message_outbox_partitioned;
    ALTER TABLE message_outbox ADD PRIMARY KEY (outbox_id);
    CREATE INDEX message_outbox_pending_idx ON message_outbox (created_at, outbox_id) WHERE status = 'PENDING';
    CREATE INDEX message_outbox_publishing_idx ON message_outbox (claimed_until) WHERE status = 'PUBLISHING';
    CREATE INDEX message_outbox_aggregate_idx ON message_outbox (aggregate_type, aggregate_id, created_at);
    CREATE INDEX message_outbox_published_idx ON message_outbox (published_at) WHERE status = 'PUBLISHED';
    CREATE INDEX message_outbox_failed_idx ON message_outbox (updated_at) WHERE status = 'FAILED';
    CREATE TRIGGER message_outbox_notify
        AFTER INSERT ON message_outbox
        FOR EACH STATEMENT EXECUTE FUNCTION message_outbox_notify();
END
$$;
-- +goose StatementEnd
