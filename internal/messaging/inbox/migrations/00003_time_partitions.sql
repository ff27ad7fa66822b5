-- message_inbox becomes range-partitioned on first_received_at: time
-- partitions, made ahead by the consumers (inbox_create_time_partitions,
-- 00004) and dropped whole by retention. The primary key is
-- (consumer_name, message_id, first_received_at): a partitioned table's
-- unique keys must hold its partition key, so (consumer_name, message_id)
-- alone is no longer unique by an index. The consumers keep it unique: a
-- transaction-scoped advisory lock on the pair before its row is looked
-- up, in every partition, and inserted (queries/inbox.sql).
--
-- On a running system: the table as it is becomes the first partition,
-- message_inbox_initial, as the outbox's did (its 00008 says how): no row
-- moves, and writers wait only for a last step that reads no row.

-- +goose NO TRANSACTION
-- +goose Up
-- +goose StatementBegin
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conname = 'message_inbox_initial_bound') THEN
        EXECUTE format('ALTER TABLE message_inbox ADD CONSTRAINT message_inbox_initial_bound CHECK (first_received_at < %L) NOT VALID',
            date_trunc('day', now(), 'UTC') + interval '48 hours');
    END IF;
END
$$;
-- +goose StatementEnd
ALTER TABLE message_inbox VALIDATE CONSTRAINT message_inbox_initial_bound;
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS message_inbox_initial_pkey ON message_inbox (consumer_name, message_id, first_received_at);

-- +goose StatementBegin
DO $$
DECLARE
    bound text := substring(pg_get_constraintdef((SELECT oid FROM pg_constraint WHERE conname = 'message_inbox_initial_bound'))
                            FROM '''([^'']+)''');
    acl record;
BEGIN
    ALTER TABLE message_inbox RENAME TO message_inbox_initial;
    ALTER TABLE message_inbox_initial DROP CONSTRAINT message_inbox_pkey;
    ALTER TABLE message_inbox_initial ADD CONSTRAINT message_inbox_initial_pkey PRIMARY KEY USING INDEX message_inbox_initial_pkey;
    ALTER INDEX message_inbox_unprocessed_idx RENAME TO message_inbox_initial_unprocessed_idx;
    ALTER INDEX message_inbox_aggregate_idx RENAME TO message_inbox_initial_aggregate_idx;
    ALTER INDEX message_inbox_processed_idx RENAME TO message_inbox_initial_processed_idx;

    CREATE TABLE message_inbox (LIKE message_inbox_initial INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
        PARTITION BY RANGE (first_received_at);
    ALTER TABLE message_inbox DROP CONSTRAINT message_inbox_initial_bound;
    ALTER TABLE message_inbox ADD CONSTRAINT message_inbox_pkey PRIMARY KEY (consumer_name, message_id, first_received_at);
    -- The indexes of 00001, on every partition.
    CREATE INDEX message_inbox_unprocessed_idx ON message_inbox (consumer_name, status, first_received_at) WHERE status <> 'PROCESSED';
    CREATE INDEX message_inbox_aggregate_idx ON message_inbox (aggregate_id, first_received_at);
    CREATE INDEX message_inbox_processed_idx ON message_inbox (processed_at) WHERE status = 'PROCESSED';
    -- Attaches the initial table's indexes to these instead of building.
    EXECUTE format('ALTER TABLE message_inbox ATTACH PARTITION message_inbox_initial FOR VALUES FROM (MINVALUE) TO (%L)', bound);
    ALTER TABLE message_inbox_initial DROP CONSTRAINT message_inbox_initial_bound;

    -- The table's privileges (granted by the service's migrations), table
    -- and columns, pass to the partitioned table; reads and writes go
    -- through it, and a partition needs none of its own.
    FOR acl IN SELECT a.privilege_type, a.grantee::regrole AS grantee FROM pg_class c, aclexplode(c.relacl) a
               WHERE c.oid = 'message_inbox_initial'::regclass AND a.grantee <> c.relowner AND a.grantee <> 0 LOOP
        EXECUTE format('GRANT %s ON message_inbox TO %s', acl.privilege_type, acl.grantee);
        EXECUTE format('REVOKE %s ON message_inbox_initial FROM %s', acl.privilege_type, acl.grantee);
    END LOOP;
    FOR acl IN SELECT a.privilege_type, a.grantee::regrole AS grantee, t.attname FROM pg_attribute t, aclexplode(t.attacl) a
               WHERE t.attrelid = 'message_inbox_initial'::regclass AND a.grantee <> 0 LOOP
        EXECUTE format('GRANT %s (%I) ON message_inbox TO %s', acl.privilege_type, acl.attname, acl.grantee);
        EXECUTE format('REVOKE %s (%I) ON message_inbox_initial FROM %s', acl.privilege_type, acl.attname, acl.grantee);
    END LOOP;
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
    ALTER TABLE message_inbox RENAME TO message_inbox_partitioned;
    CREATE TABLE message_inbox (LIKE message_inbox_partitioned INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
    INSERT INTO message_inbox SELECT * FROM message_inbox_partitioned;
    FOR acl IN SELECT a.privilege_type, a.grantee::regrole AS grantee FROM pg_class c, aclexplode(c.relacl) a
               WHERE c.oid = 'message_inbox_partitioned'::regclass AND a.grantee <> c.relowner AND a.grantee <> 0 LOOP
        EXECUTE format('GRANT %s ON message_inbox TO %s', acl.privilege_type, acl.grantee);
    END LOOP;
    FOR acl IN SELECT a.privilege_type, a.grantee::regrole AS grantee, t.attname FROM pg_attribute t, aclexplode(t.attacl) a
               WHERE t.attrelid = 'message_inbox_partitioned'::regclass AND a.grantee <> 0 LOOP
        EXECUTE format('GRANT %s (%I) ON message_inbox TO %s', acl.privilege_type, acl.attname, acl.grantee);
    END LOOP;
    DROP TABLE message_inbox_partitioned;
    ALTER TABLE message_inbox ADD PRIMARY KEY (consumer_name, message_id);
    CREATE INDEX message_inbox_unprocessed_idx ON message_inbox (consumer_name, status, first_received_at) WHERE status <> 'PROCESSED';
    CREATE INDEX message_inbox_aggregate_idx ON message_inbox (aggregate_id, first_received_at);
    CREATE INDEX message_inbox_processed_idx ON message_inbox (processed_at) WHERE status = 'PROCESSED';
END
$$;
-- +goose StatementEnd
