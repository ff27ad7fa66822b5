-- name: LockInboxKeys :exec
-- The deduplication guard, before a transaction looks a message up and
-- inserts its row: message_inbox is partitioned by time, so no unique
-- index holds (consumer_name, message_id) alone (its key also has
-- first_received_at). A transaction-scoped advisory lock on each pair
-- does: a concurrent delivery of the same message waits here until this
-- transaction ends, and its next statement sees what this one committed.
-- Locks are taken in key order, so that two batches cannot deadlock.
SELECT pg_advisory_xact_lock(k.key)
FROM (SELECT DISTINCT hashtextextended(@consumer_name::text || E'\x1f' || m.message_id, 0) AS key
      FROM unnest(@message_ids::text[]) AS m (message_id)
      ORDER BY 1) AS k;

-- name: InsertInboxRows :many
-- The first delivery of a message to a consumer inserts its row, for every
-- delivery of a batch in one statement, under LockInboxKeys; any other
-- finds it, in whichever time partition it is. The row is written as it
-- will be when the transaction commits (PROCESSED, APPLIED): nobody sees
-- it before then, and a rollback takes it away with the effect. Of two
-- deliveries of one message in a batch, the first one writes the row. It
-- returns the message ids it inserted; each of the others found its row,
-- and goes through TouchProcessedInbox and LockInbox. Empty strings are
-- NULLs.
--
-- With look_parked (an ordered worker), it also returns, for each row it
-- inserted, what EarlierParkedOfAggregate would find for it, so that a
-- first delivery needs no lookup of its own: the oldest row of the same
-- consumer and aggregate left unprocessed and received before this one's,
-- as that query defines it, read in the statement's snapshot (the rows
-- the statement inserts are not in it; they are PROCESSED in any case),
-- or an empty string.
WITH inserted AS (
INSERT INTO message_inbox (
    consumer_name, message_id, message_type, message_version, aggregate_id, status, outcome,
    attempt_count, payload_hash, processing_started_at, processed_at, correlation_id, causation_id, trace_id
)
SELECT @consumer_name::text, e.message_id, e.message_type, e.message_version, nullif(e.aggregate_id, ''), 'PROCESSED', 'APPLIED',
       1, e.payload_hash, now(), now(), nullif(e.correlation_id, ''), nullif(e.causation_id, ''), nullif(e.trace_id, '')
FROM (
    SELECT DISTINCT ON (u.message_id) u.*
    FROM (
        -- Set-returning functions in a select list advance together: row i
        -- takes element i of every array, and ord is i.
        SELECT unnest(@message_ids::text[]) AS message_id, unnest(@message_types::text[]) AS message_type,
               unnest(@message_versions::integer[]) AS message_version, unnest(@aggregate_ids::text[]) AS aggregate_id,
               unnest(@payload_hashes::text[]) AS payload_hash, unnest(@correlation_ids::text[]) AS correlation_id,
               unnest(@causation_ids::text[]) AS causation_id, unnest(@trace_ids::text[]) AS trace_id,
               generate_series(1, cardinality(@message_ids::text[])) AS ord
    ) AS u
    ORDER BY u.message_id, u.ord
) AS e
WHERE NOT EXISTS (SELECT 1 FROM message_inbox x WHERE x.consumer_name = @consumer_name::text AND x.message_id = e.message_id)
ORDER BY e.ord
RETURNING message_id, aggregate_id, first_received_at
)
SELECT n.message_id, coalesce(p.message_id, '')::text AS earlier_parked_id
FROM inserted n
LEFT JOIN LATERAL (
    SELECT p.message_id
    FROM message_inbox p
    WHERE @look_parked::boolean
      AND p.consumer_name = @consumer_name::text AND p.aggregate_id = n.aggregate_id
      AND p.status IN ('RETRYABLE_FAILED', 'PERMANENT_FAILED', 'POISONED') AND p.message_id <> n.message_id
      AND p.first_received_at < n.first_received_at
    ORDER BY p.first_received_at
    LIMIT 1
) AS p ON true;

-- name: TouchProcessedInbox :one
-- A delivery whose row exists: if the message is PROCESSED, a duplicate;
-- remember when it was last seen, and return the first body's hash. One
-- statement where a lock and then an update would be two: the UPDATE takes
-- the row lock itself, and after waiting for a concurrent writer it checks
-- the status again on the row as that writer left it. No row back: not
-- PROCESSED, see LockInbox.
UPDATE message_inbox SET last_received_at = now()
WHERE consumer_name = @consumer_name AND message_id = @message_id AND status = 'PROCESSED'
RETURNING payload_hash;

-- name: LockInbox :one
-- The row of a message seen before, locked for this transaction.
SELECT status, attempt_count, payload_hash,
       coalesce(processing_started_at < now() - make_interval(secs => @lease_seconds::float8), true)::boolean AS stale
FROM message_inbox
WHERE consumer_name = @consumer_name AND message_id = @message_id
FOR UPDATE;

-- name: RestartInbox :one
-- Processing a message again (a retry, a replay, or a takeover), written,
-- like a first delivery, as it will be if the transaction commits.
UPDATE message_inbox
SET status = 'PROCESSED', outcome = 'APPLIED', outcome_reason = NULL, attempt_count = attempt_count + 1,
    processing_started_at = now(), processed_at = now(), last_received_at = now(),
    trace_id = coalesce(@trace_id, trace_id)
WHERE consumer_name = @consumer_name AND message_id = @message_id
RETURNING attempt_count;

-- name: TouchInbox :exec
-- A duplicate delivery: remember when it was last seen.
UPDATE message_inbox SET last_received_at = now()
WHERE consumer_name = @consumer_name AND message_id = @message_id;

-- name: MarkInboxProcessed :exec
UPDATE message_inbox
SET status = 'PROCESSED', outcome = @outcome, outcome_reason = @outcome_reason, processed_at = now()
WHERE consumer_name = @consumer_name AND message_id = @message_id;

-- name: HoldInbox :exec
-- Between the two steps of an external side effect: the row commits as
-- PROCESSING, and only the second step marks it PROCESSED. The processing
-- lease counts from here, the handler's last statement; what follows it
-- before the commit (the follow-up rows, and in a batch the deliveries
-- after this one) is bounded by CONSUMER_TX_TIMEOUT, and the call that
-- follows the commit by nine tenths of the lease.
UPDATE message_inbox
SET status = 'PROCESSING', outcome = NULL, processed_at = NULL, processing_started_at = clock_timestamp()
WHERE consumer_name = @consumer_name AND message_id = @message_id;

-- name: FenceInbox :one
-- The second step of an external side effect locks the row of the attempt
-- that made the call. No row back: another delivery took the message over
-- after the lease (attempt_count moved on), and this attempt must record
-- nothing.
SELECT attempt_count FROM message_inbox
WHERE consumer_name = @consumer_name AND message_id = @message_id
  AND status = 'PROCESSING' AND attempt_count = @attempt
FOR UPDATE;

-- name: FenceInboxProcessed :one
-- FenceInbox and MarkInboxProcessed (APPLIED) in one statement, for the
-- second step of a call that succeeded: the UPDATE locks the row of the
-- attempt that made the call, or finds none when another delivery took the
-- message over (then this attempt records nothing).
UPDATE message_inbox
SET status = 'PROCESSED', outcome = 'APPLIED', outcome_reason = NULL, processed_at = now()
WHERE consumer_name = @consumer_name AND message_id = @message_id
  AND status = 'PROCESSING' AND attempt_count = @attempt
RETURNING attempt_count;

-- name: RecordInboxFailure :one
-- Records a failed attempt after its transaction rolled back, in a
-- transaction of its own, so that the failure is remembered. It never
-- touches a PROCESSED row: what committed stays committed. Nor a row
-- another delivery holds PROCESSING within its lease: held_attempt is the
-- attempt whose committed hold this failure ends (a failed external call),
-- 0 when the attempt committed nothing; a late record of an attempt that
-- was taken over meanwhile finds a newer attempt there, and leaves it be.
-- Under LockInboxKeys: the row is updated, or inserted when there is
-- none, the message's first attempt.
WITH updated AS (
    UPDATE message_inbox i
    SET status = @status::text,
        attempt_count = i.attempt_count + CASE WHEN i.status = 'PROCESSING' THEN 0 ELSE 1 END,
        last_error_code = sqlc.narg(last_error_code)::text,
        last_error_message = sqlc.narg(last_error_message)::text,
        last_received_at = now()
    WHERE i.consumer_name = @consumer_name::text AND i.message_id = @message_id::text
      AND i.status <> 'PROCESSED'
      AND (i.status <> 'PROCESSING'
           OR i.attempt_count = @held_attempt::integer
           OR i.processing_started_at < now() - make_interval(secs => @lease_seconds::float8))
    RETURNING i.status, i.attempt_count
), inserted AS (
    INSERT INTO message_inbox (
        consumer_name, message_id, message_type, message_version, aggregate_id, status,
        attempt_count, payload_hash, processing_started_at, last_error_code, last_error_message,
        correlation_id, causation_id, trace_id
    )
    SELECT @consumer_name::text, @message_id::text, @message_type::text, @message_version::integer, sqlc.narg(aggregate_id)::text, @status::text,
           1, @payload_hash::text, now(), sqlc.narg(last_error_code)::text, sqlc.narg(last_error_message)::text,
           sqlc.narg(correlation_id)::text, sqlc.narg(causation_id)::text, sqlc.narg(trace_id)::text
    WHERE NOT EXISTS (SELECT 1 FROM message_inbox x WHERE x.consumer_name = @consumer_name::text AND x.message_id = @message_id::text)
    RETURNING status, attempt_count
)
SELECT u.status, u.attempt_count FROM updated u
UNION ALL
SELECT n.status, n.attempt_count FROM inserted n;

-- name: CreateTimePartitions :one
-- Makes the time partitions of message_inbox ahead (00004), and returns
-- where the last one ends.
SELECT inbox_create_time_partitions(@period::text, @ahead::integer)::timestamptz AS horizon;

-- name: TimePartitions :many
-- Every time partition of message_inbox, and whether retention may drop
-- it; with drop_held_none, retention itself: drops those it may (00004).
SELECT p.name::text AS partition_name, p.range_end::timestamptz AS range_end,
       p.past_retention::boolean AS past_retention, p.held_rows::bigint AS held_rows, p.dropped::boolean AS dropped
FROM inbox_time_partitions(make_interval(secs => @retention_seconds::float8), @drop_held_none::boolean)
     AS p (name, range_start, range_end, past_retention, held_rows, dropped);

-- name: GetInbox :one
SELECT status, outcome, outcome_reason, last_error_code, last_error_message, attempt_count
FROM message_inbox
WHERE consumer_name = @consumer_name AND message_id = @message_id;

-- name: EarlierParkedOfAggregate :one
-- With partitions, a message waits behind an earlier message of its
-- aggregate for the same consumer that left the queue unprocessed: the
-- oldest such row, received before this message's own (or before now, for
-- a message not seen yet). Parked by the consumer (PERMANENT_FAILED,
-- POISONED), or failed and then dead-lettered by the broker itself
-- (RETRYABLE_FAILED: the partition's worker retries a failure in place,
-- and records a redelivery before it processes it, MarkRedeliveredInbox,
-- before it takes the next message; so a later message finds an earlier
-- one in that state only when it is no longer ahead of it in the queue).
-- InsertInboxRows answers the same for the rows it inserts (look_parked):
-- the two must agree.
SELECT p.message_id
FROM message_inbox p
WHERE p.consumer_name = @consumer_name AND p.aggregate_id = @aggregate_id
  AND p.status IN ('RETRYABLE_FAILED', 'PERMANENT_FAILED', 'POISONED') AND p.message_id <> @message_id
  AND p.first_received_at < coalesce(
      (SELECT s.first_received_at FROM message_inbox s WHERE s.consumer_name = @consumer_name AND s.message_id = @message_id),
      now())
ORDER BY p.first_received_at
LIMIT 1;

-- name: MarkRedeliveredInbox :exec
-- With partitions, a redelivered message that has no row yet (its earlier
-- deliveries ended without an ack and without a failure on record: a lost
-- connection, a crash, a consumer timeout) gets one, RETRYABLE_FAILED,
-- committed before it is processed. Each such return counts toward the
-- queue's x-delivery-limit: should the broker dead-letter the message, the
-- later messages of its aggregate find this row and wait behind it
-- (EarlierParkedOfAggregate). Processing it takes the row over, as after
-- any failed attempt (RestartInbox). Empty strings are NULLs.
-- Under LockInboxKeys.
INSERT INTO message_inbox (
    consumer_name, message_id, message_type, message_version, aggregate_id, status,
    attempt_count, payload_hash, last_error_code, last_error_message, correlation_id, causation_id, trace_id
)
SELECT @consumer_name::text, @message_id::text, @message_type::text, @message_version::integer, nullif(@aggregate_id::text, ''), 'RETRYABLE_FAILED',
       0, @payload_hash::text, 'redelivered', 'an earlier delivery ended without an ack (a lost connection, a crash, a consumer timeout)',
       nullif(@correlation_id::text, ''), nullif(@causation_id::text, ''), nullif(@trace_id::text, '')
WHERE NOT EXISTS (SELECT 1 FROM message_inbox x WHERE x.consumer_name = @consumer_name::text AND x.message_id = @message_id::text);

-- name: ForgetFailedInbox :execrows
-- An operator discarded a parked message for good: its failed row goes, so
-- that the later messages of its aggregate parked behind it may be
-- replayed. A PROCESSED row is never touched.
DELETE FROM message_inbox
WHERE consumer_name = @consumer_name AND message_id = @message_id
  AND status IN ('RETRYABLE_FAILED', 'PERMANENT_FAILED', 'POISONED');
