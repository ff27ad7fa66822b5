-- The relays that share the partitions, each with when its presence ends
-- (its lease, renewed at every poll): a relay counts toward the fair share
-- from its first turn, before it holds any partition, so that one that
-- joins while another holds every partition gets its share.

-- +goose Up
CREATE TABLE outbox_relay (
    relay_id   text        PRIMARY KEY,
    seen_until timestamptz NOT NULL
);

-- +goose Down
DROP TABLE outbox_relay;
