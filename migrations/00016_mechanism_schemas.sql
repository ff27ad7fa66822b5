-- The outbox and the inbox own their tables now: their migrations live
-- with them (internal/messaging/outbox/migrations, .../inbox/migrations),
-- numbered on their own and recorded in outbox_schema_version and
-- inbox_schema_version. Versions 2, 3 and 14 of this sequence created and
-- altered those tables before; a database migrated then had the
-- mechanisms' versions recorded as applied (store.Migrator), and this
-- forgets the old records, nothing else. The tables stay as they are.

-- +goose Up
DELETE FROM goose_db_version WHERE version_id IN (2, 3, 14);

-- +goose Down
-- Nothing to put back: the mechanisms' version tables keep the record.
