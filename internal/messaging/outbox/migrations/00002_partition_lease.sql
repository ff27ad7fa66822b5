-- Relays share the outbox by partition (RELAY_PARTITIONS): a row's
-- partition is mod(hashtext(aggregate_id) + 2^31, partitions), so all the
-- messages of one aggregate are in one partition. Each relay leases a fair
-- share of the partitions here, renews its leases at every poll, and
-- claims only the rows of its partitions; a dead relay's partitions pass to
-- the others when its leases end. One row per partition, made by the
-- relays as they start.

-- +goose Up
CREATE TABLE outbox_partition_lease (
    partition_no integer     PRIMARY KEY CHECK (partition_no >= 0),
    relay_id     text,
    lease_until  timestamptz NOT NULL DEFAULT '-infinity'
);

-- +goose Down
DROP TABLE outbox_partition_lease;
