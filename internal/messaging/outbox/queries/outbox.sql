-- name: InsertOutboxMessages :exec
-- Every message of one transaction in one statement (and so one NOTIFY).
-- Set-returning functions in a select list advance together, so row i takes
-- element i of every array.
INSERT INTO message_outbox (
    outbox_id, aggregate_type, aggregate_id, message_type, message_version,
    exchange_name, routing_key, payload, headers
)
SELECT unnest(@outbox_ids::uuid[]),
       unnest(@aggregate_types::text[]),
       unnest(@aggregate_ids::text[]),
       unnest(@message_types::text[]),
       unnest(@message_versions::integer[]),
       unnest(@exchange_names::text[]),
       unnest(@routing_keys::text[]),
       unnest(@payloads::jsonb[]),
       unnest(@headers::jsonb[]);

-- name: ClaimOutbox :many
-- Leases up to max_rows due PENDING rows, oldest first, to one claim of one
-- relay (claimed_by: a token unique to this claim), and counts the
-- attempt. SKIP LOCKED lets relays claim side by side without waiting for
-- each other; the row locks last only as long as this one statement, and
-- the lease (claimed_until) takes over from there.
--
-- A row is claimed only when no earlier row of its aggregate is still
-- unpublished (PENDING, PUBLISHING, FAILED): the messages of one aggregate
-- go out one at a time, in the order they were written, and a message the
-- broker refused holds the later ones of its aggregate back until it is
-- published (or an operator retries it). Rows of held_types are left alone
-- (a reader's queue of theirs is missing). With created_before set (the
-- log-tailing relay's sweep, Relay.ClaimOnlyBefore), only rows written
-- before it, or whose last publish failed, are claimed: the newer ones are
-- the log stream's. The two are scanned apart, each up to max_rows rows
-- locked: written_before walks message_outbox_pending_idx only up to
-- created_before (unbounded when it is NULL), failed_since the small
-- index of the failed rows (00016) from created_before on (nothing when it
-- is NULL); picked keeps the first max_rows of both, and the rows locked
-- beyond them are free again when the statement ends. One condition with
-- OR bounded neither scan: under a held xmin horizon it walked the dead
-- index entry of every row the stream published since (issue 28). A
-- relay that shares the outbox by partition claims with
-- ClaimOutboxInPartitions instead; a row's partition here is -1.
-- The scan starts after (after_created, after_id), the last row of the
-- relay's previous claim when that claim was full ('-infinity' and the nil
-- uuid: from the start): while a held xmin horizon keeps the index entries
-- of every row claimed since, a drain's claims step over them once, not
-- once per claim (Relay.claimFloor says when the relay scans from the
-- start). The rows are fetched again by their whole key, (outbox_id,
-- created_at), each in its own time partition. The earlier-row check probes
-- message_outbox_aggregate_idx once per candidate (about 0.05 ms each,
-- measured on a 20,000-row backlog) in the time partitions from the
-- oldest unpublished row's (outbox_oldest_unpublished, 00010, once per
-- scan) to the candidate's: the others are skipped as the statement
-- runs, so that a year of weekly partitions of published rows costs the
-- claim little (docs/benchmarks.md, "A year of history").
WITH written_before AS MATERIALIZED (
    SELECT o.outbox_id, o.created_at
    FROM message_outbox o
    WHERE o.status = 'PENDING' AND o.next_attempt_at <= now()
      AND o.message_type <> ALL (@held_types::text[])
      AND o.created_at < coalesce(sqlc.narg(created_before)::timestamptz, 'infinity'::timestamptz)
      AND (o.created_at, o.outbox_id) > (@after_created::timestamptz, @after_id::uuid)
      AND NOT EXISTS (
          SELECT 1 FROM message_outbox e
          WHERE e.aggregate_type = o.aggregate_type AND e.aggregate_id = o.aggregate_id
            AND e.status <> 'PUBLISHED' AND e.created_at <= o.created_at
            AND (e.created_at, e.outbox_id) < (o.created_at, o.outbox_id)
            AND e.created_at >= (SELECT outbox_oldest_unpublished()))
    ORDER BY o.created_at, o.outbox_id
    LIMIT @max_rows
    FOR UPDATE SKIP LOCKED
), failed_since AS MATERIALIZED (
    SELECT o.outbox_id, o.created_at
    FROM message_outbox o
    WHERE o.status = 'PENDING' AND o.last_error IS NOT NULL AND o.next_attempt_at <= now()
      AND o.message_type <> ALL (@held_types::text[])
      AND o.created_at >= sqlc.narg(created_before)::timestamptz
      AND (o.created_at, o.outbox_id) > (@after_created::timestamptz, @after_id::uuid)
      AND NOT EXISTS (
          SELECT 1 FROM message_outbox e
          WHERE e.aggregate_type = o.aggregate_type AND e.aggregate_id = o.aggregate_id
            AND e.status <> 'PUBLISHED' AND e.created_at <= o.created_at
            AND (e.created_at, e.outbox_id) < (o.created_at, o.outbox_id)
            AND e.created_at >= (SELECT outbox_oldest_unpublished()))
    ORDER BY o.created_at, o.outbox_id
    LIMIT @max_rows
    FOR UPDATE SKIP LOCKED
), picked AS (
    SELECT w.outbox_id, w.created_at FROM written_before w
    UNION ALL
    SELECT f.outbox_id, f.created_at FROM failed_since f
    ORDER BY 2, 1
    LIMIT @max_rows
)
UPDATE message_outbox m
SET status = 'PUBLISHING',
    claimed_by = @claimer,
    claimed_until = now() + make_interval(secs => @lease_seconds::float8),
    attempt_count = m.attempt_count + 1,
    updated_at = now()
FROM picked p
WHERE m.outbox_id = p.outbox_id AND m.created_at = p.created_at
RETURNING m.outbox_id, m.aggregate_id, m.message_type, m.message_version, m.exchange_name,
          m.routing_key, m.payload, m.headers, m.attempt_count, m.claimed_by, m.created_at,
          -1::integer AS partition;

-- name: ClaimOutboxInPartitions :many
-- ClaimOutbox for a relay that shares the outbox by partition: it claims
-- only rows of its partitions (mine), and returns each row's partition,
-- outbox_partition(aggregate_id, partitions).
WITH written_before AS MATERIALIZED (
    SELECT o.outbox_id, o.created_at
    FROM message_outbox o
    WHERE o.status = 'PENDING' AND o.next_attempt_at <= now()
      AND o.message_type <> ALL (@held_types::text[])
      AND o.created_at < coalesce(sqlc.narg(created_before)::timestamptz, 'infinity'::timestamptz)
      AND (o.created_at, o.outbox_id) > (@after_created::timestamptz, @after_id::uuid)
      AND outbox_partition(o.aggregate_id, @partitions::integer) = ANY (@mine::integer[])
      AND NOT EXISTS (
          SELECT 1 FROM message_outbox e
          WHERE e.aggregate_type = o.aggregate_type AND e.aggregate_id = o.aggregate_id
            AND e.status <> 'PUBLISHED' AND e.created_at <= o.created_at
            AND (e.created_at, e.outbox_id) < (o.created_at, o.outbox_id)
            AND e.created_at >= (SELECT outbox_oldest_unpublished()))
    ORDER BY o.created_at, o.outbox_id
    LIMIT @max_rows
    FOR UPDATE SKIP LOCKED
), failed_since AS MATERIALIZED (
    SELECT o.outbox_id, o.created_at
    FROM message_outbox o
    WHERE o.status = 'PENDING' AND o.last_error IS NOT NULL AND o.next_attempt_at <= now()
      AND o.message_type <> ALL (@held_types::text[])
      AND o.created_at >= sqlc.narg(created_before)::timestamptz
      AND (o.created_at, o.outbox_id) > (@after_created::timestamptz, @after_id::uuid)
      AND outbox_partition(o.aggregate_id, @partitions::integer) = ANY (@mine::integer[])
      AND NOT EXISTS (
          SELECT 1 FROM message_outbox e
          WHERE e.aggregate_type = o.aggregate_type AND e.aggregate_id = o.aggregate_id
            AND e.status <> 'PUBLISHED' AND e.created_at <= o.created_at
            AND (e.created_at, e.outbox_id) < (o.created_at, o.outbox_id)
            AND e.created_at >= (SELECT outbox_oldest_unpublished()))
    ORDER BY o.created_at, o.outbox_id
    LIMIT @max_rows
    FOR UPDATE SKIP LOCKED
), picked AS (
    SELECT w.outbox_id, w.created_at FROM written_before w
    UNION ALL
    SELECT f.outbox_id, f.created_at FROM failed_since f
    ORDER BY 2, 1
    LIMIT @max_rows
)
UPDATE message_outbox m
SET status = 'PUBLISHING',
    claimed_by = @claimer,
    claimed_until = now() + make_interval(secs => @lease_seconds::float8),
    attempt_count = m.attempt_count + 1,
    updated_at = now()
FROM picked p
WHERE m.outbox_id = p.outbox_id AND m.created_at = p.created_at
RETURNING m.outbox_id, m.aggregate_id, m.message_type, m.message_version, m.exchange_name,
          m.routing_key, m.payload, m.headers, m.attempt_count, m.claimed_by, m.created_at,
          outbox_partition(m.aggregate_id, @partitions::integer) AS partition;

-- name: LeasePartitions :many
-- A relay's turn at sharing the partitions, at every poll: it renews its
-- presence, then its fair share (the partitions divided by the relays
-- present, itself included, rounded up): it renews the leases it holds up
-- to that share, gives back the rest, highest first, and takes free or
-- expired partitions until it holds its share. A relay that joins counts
-- from its first turn, so it gets its share even while another holds
-- every partition. One UPDATE renews and gives back: a row may be changed
-- once in a statement. Returns the partitions it holds now
-- (EnsurePartitions makes the rows).
WITH present AS (
    INSERT INTO outbox_relay AS p (relay_id, seen_until)
    VALUES (@owner, now() + make_interval(secs => @lease_seconds::float8))
    ON CONFLICT (relay_id) DO UPDATE SET seen_until = excluded.seen_until
), gone AS (
    DELETE FROM outbox_relay g WHERE g.seen_until < now() - interval '1 hour'
), share AS (
    SELECT ceil(sqlc.arg(partitions)::integer::float8
                / ((count(*) FILTER (WHERE v.relay_id <> @owner))::integer + 1))::integer AS fair
    FROM outbox_relay v
    WHERE v.seen_until > now()
), mine AS (
    SELECT m.partition_no, row_number() OVER (ORDER BY m.partition_no) AS k
    FROM outbox_partition_lease m
    WHERE m.relay_id = @owner AND m.partition_no < @partitions::integer
), kept AS (
    UPDATE outbox_partition_lease r
    SET relay_id = CASE WHEN m.k <= s.fair THEN r.relay_id END,
        lease_until = CASE WHEN m.k <= s.fair THEN now() + make_interval(secs => @lease_seconds::float8)
                           ELSE '-infinity'::timestamptz END
    FROM mine m, share s
    WHERE r.partition_no = m.partition_no
    RETURNING r.partition_no, r.relay_id IS NOT NULL AS held
), taken AS (
    UPDATE outbox_partition_lease t
    SET relay_id = @owner, lease_until = now() + make_interval(secs => @lease_seconds::float8)
    WHERE t.partition_no IN (
        SELECT f.partition_no FROM outbox_partition_lease f
        WHERE f.partition_no < @partitions::integer
          AND (f.relay_id IS NULL OR f.lease_until <= now()) AND f.relay_id IS DISTINCT FROM @owner
        ORDER BY f.partition_no
        LIMIT greatest((SELECT s.fair FROM share s) - (SELECT count(*) FROM mine), 0)
        FOR UPDATE SKIP LOCKED)
    RETURNING t.partition_no
)
SELECT k.partition_no::integer AS partition_no FROM kept k WHERE k.held
UNION ALL
SELECT tk.partition_no FROM taken tk
ORDER BY 1;

-- name: EnsurePartitions :exec
-- The lease rows of partitions 0 to partitions-1, made once by each relay
-- as it starts.
INSERT INTO outbox_partition_lease (partition_no)
SELECT generate_series(0, @last_partition::integer)
ON CONFLICT (partition_no) DO NOTHING;

-- name: ReleasePartitions :exec
-- A stopping relay gives its partitions back, for the others to take at
-- once instead of after the lease, and leaves the relays present.
WITH left_relays AS (
    DELETE FROM outbox_relay o WHERE o.relay_id = @owner
)
UPDATE outbox_partition_lease l SET relay_id = NULL, lease_until = '-infinity'
WHERE l.relay_id = @owner;

-- name: BringBackNackedOutbox :execrows
-- The broker confirms again after it nacked: the rows it nacked meanwhile,
-- PENDING until their next attempt, are due now.
UPDATE message_outbox
SET next_attempt_at = now()
WHERE status = 'PENDING' AND next_attempt_at > now() AND last_error = @reason::text;

-- name: MarkOutbox :one
-- What became of the rows of one batch, in one statement (one round trip,
-- one commit), each row in exactly one of three lists:
--   - published: the broker confirmed them: PUBLISHED;
--   - refused: returned as unroutable (no queue matched its routing key),
--     the one cause that belongs to the message: back to PENDING after
--     their backoff, or FAILED once max_attempts is spent;
--   - released: handed back with the attempt not counted: rows a stopping
--     relay never got to publish, and rows the broker could not take (a
--     nack, a lost connection, a confirm that never came). Trouble that is
--     not the message's own never spends its attempts. Due after retry_in,
--     with the reason in last_error when there is one.
-- Each row is matched on the claim that took it (claimed_by holds a token
-- unique to each claim): a relay whose lease ran out, and whose row was
-- claimed again, cannot touch the newer claim, however often it retries;
-- and a retry of a statement that took effect finds its rows no longer
-- PUBLISHING under its token, and changes nothing. The lists are disjoint,
-- so no row is changed twice by the statement.
-- Each row is found by its whole key, (outbox_id, created_at), and the
-- batch's span of created_at (oldest to newest) bounds every list: with
-- a year of weekly time partitions, the statement is planned and run on
-- the one or two partitions the batch was written in, not on all of them
-- (docs/benchmarks.md, "A year of history").
WITH published AS (
    UPDATE message_outbox m
    SET status = 'PUBLISHED', published_at = now(), claimed_by = NULL, claimed_until = NULL,
        last_error = NULL, updated_at = now()
    FROM (SELECT unnest(@published_ids::uuid[]) AS outbox_id, unnest(@published_created::timestamptz[]) AS created_at,
                 unnest(@published_tokens::text[]) AS token) AS c
    WHERE m.outbox_id = c.outbox_id AND m.created_at = c.created_at AND m.claimed_by = c.token AND m.status = 'PUBLISHING'
      AND m.created_at BETWEEN @oldest::timestamptz AND @newest::timestamptz
    RETURNING m.outbox_id
), refused AS (
    UPDATE message_outbox m
    SET status = CASE WHEN m.attempt_count >= @max_attempts::integer THEN 'FAILED' ELSE 'PENDING' END,
        next_attempt_at = now() + make_interval(secs => c.retry_in),
        last_error = c.error,
        claimed_by = NULL, claimed_until = NULL, updated_at = now()
    FROM (SELECT unnest(@refused_ids::uuid[]) AS outbox_id, unnest(@refused_created::timestamptz[]) AS created_at,
                 unnest(@refused_tokens::text[]) AS token,
                 unnest(@refused_errors::text[]) AS error, unnest(@refused_retry_in_seconds::float8[]) AS retry_in) AS c
    WHERE m.outbox_id = c.outbox_id AND m.created_at = c.created_at AND m.claimed_by = c.token AND m.status = 'PUBLISHING'
      AND m.created_at BETWEEN @oldest::timestamptz AND @newest::timestamptz
    RETURNING m.outbox_id, m.status
), released AS (
    UPDATE message_outbox m
    SET status = 'PENDING', attempt_count = m.attempt_count - 1,
        next_attempt_at = now() + make_interval(secs => c.retry_in),
        last_error = coalesce(nullif(c.error, ''), m.last_error),
        claimed_by = NULL, claimed_until = NULL, updated_at = now()
    FROM (SELECT unnest(@released_ids::uuid[]) AS outbox_id, unnest(@released_created::timestamptz[]) AS created_at,
                 unnest(@released_tokens::text[]) AS token,
                 unnest(@released_errors::text[]) AS error, unnest(@released_retry_in_seconds::float8[]) AS retry_in) AS c
    WHERE m.outbox_id = c.outbox_id AND m.created_at = c.created_at AND m.claimed_by = c.token AND m.status = 'PUBLISHING'
      AND m.created_at BETWEEN @oldest::timestamptz AND @newest::timestamptz
    RETURNING m.outbox_id
)
SELECT (SELECT count(*) FROM published)::bigint AS published,
       (SELECT count(*) FROM refused)::bigint AS refused,
       (SELECT count(*) FROM released)::bigint AS released,
       coalesce((SELECT array_agg(outbox_id) FROM refused WHERE status = 'FAILED'), '{}')::uuid[] AS failed_ids;

-- name: RecoverExpiredOutboxClaims :many
-- Rows whose relay went away (killed, partitioned) while PUBLISHING: once
-- the lease has run out they are PENDING again, due now, with the attempt
-- the claim counted given back: a relay's death is not the message's
-- fault, and does not spend its attempts. Any relay runs this; no one has
-- to step in. It looks at the leases that ran out within the last
-- window_seconds (Relay.recoverExpired): while a session holds the xmin
-- horizon, the index entries of every claim made since stay, and a scan of
-- every lease that ever ran out would fetch each one's row.
UPDATE message_outbox
SET status = 'PENDING', attempt_count = greatest(attempt_count - 1, 0), next_attempt_at = now(),
    last_error = 'lease expired: relay ' || claimed_by || ' did not finish the publish',
    claimed_by = NULL, claimed_until = NULL, updated_at = now()
WHERE status = 'PUBLISHING' AND claimed_until < now()
  AND claimed_until >= now() - make_interval(secs => @window_seconds::float8)
RETURNING outbox_id;

-- name: GiveBackOutboxClaims :execrows
-- Claims whose outcome the relay does not know: the claim's answer was
-- lost (the connection broke, the primary died or was switched over), its
-- COMMIT perhaps done; or the relay marked the claim just before its
-- database failed, and a failover may have lost the mark. Their rows, if
-- any are still PUBLISHING under them, are PENDING again at once, the
-- attempt given back, instead of waiting until the lease runs out
-- (RecoverExpiredOutboxClaims). A claim that took nothing, or whose mark
-- holds, changes nothing; no publish of these rows is under way (the
-- relay never saw them, or has marked them).
UPDATE message_outbox
SET status = 'PENDING', attempt_count = greatest(attempt_count - 1, 0), next_attempt_at = now(),
    claimed_by = NULL, claimed_until = NULL, updated_at = now()
WHERE status = 'PUBLISHING' AND claimed_by = ANY(@tokens::text[]);

-- name: CreateTimePartitions :one
-- Makes the time partitions of message_outbox ahead (00009), and returns
-- where the last one ends.
SELECT outbox_create_time_partitions(@period::text, @ahead::integer)::timestamptz AS horizon;

-- name: TimePartitions :many
-- Every time partition of message_outbox, and whether retention may drop
-- it; with drop_held_none, retention itself: drops those it may (00009).
SELECT p.name::text AS partition_name, p.range_end::timestamptz AS range_end,
       p.past_retention::boolean AS past_retention, p.held_rows::bigint AS held_rows, p.dropped::boolean AS dropped
FROM outbox_time_partitions(make_interval(secs => @retention_seconds::float8), @drop_held_none::boolean)
     AS p (name, range_start, range_end, past_retention, held_rows, dropped);
