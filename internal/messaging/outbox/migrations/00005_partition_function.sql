-- The partition of an aggregate's messages when the relays share the
-- outbox by partition: mod(hashtext(aggregate_id) + 2^31, partitions),
-- 0 to partitions - 1, the same for every message of one aggregate. The
-- claim uses it; the outbox's Go code has the same function (partition.go)
-- and a test that the two agree. IMMUTABLE: the planner inlines it. Only
-- the roles granted EXECUTE may call it: the relays' (the service's
-- migrations grant it).

-- +goose Up
CREATE FUNCTION outbox_partition(aggregate_id text, partitions integer) RETURNS integer
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    RETURN mod(hashtext(aggregate_id)::bigint + 2147483648, greatest(partitions, 1))::integer;
REVOKE EXECUTE ON FUNCTION outbox_partition(text, integer) FROM PUBLIC;

-- +goose Down
DROP FUNCTION outbox_partition(text, integer);
