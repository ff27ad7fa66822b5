-- name: InsertInboxRows :many
-- The deduplication guard, for every delivery of a batch in one statement:
-- the first delivery of a message to a consumer inserts its row; any other
-- finds it (and, while the first one's transaction is open, waits for it on
-- the primary key). The row is written as it will be when the transaction
-- commits (PROCESSED, APPLIED): nobody sees it before then, and a rollback
-- takes it away with the effect. Rows are inserted in the order given (so
-- of two deliveries of one message in a batch, the first one writes the
-- row). It returns the message ids it inserted; each of the others found
-- its row, and goes through TouchProcessedInbox and LockInbox. Empty
-- strings are NULLs.
INSERT INTO message_inbox (
    consumer_name, message_id, message_type, message_version, aggregate_id, status, outcome,
    attempt_count, payload_hash, processing_started_at, processed_at, correlation_id, causation_id, trace_id
)
SELECT @consumer_name::text, e.message_id, e.message_type, e.message_version, nullif(e.aggregate_id, ''), 'PROCESSED', 'APPLIED',
       1, e.payload_hash, now(), now(), nullif(e.correlation_id, ''), nullif(e.causation_id, ''), nullif(e.trace_id, '')
FROM (
    -- Set-returning functions in a select list advance together: row i
    -- takes element i of every array, and ord is i.
    SELECT unnest(@message_ids::text[]) AS message_id, unnest(@message_types::text[]) AS message_type,
           unnest(@message_versions::integer[]) AS message_version, unnest(@aggregate_ids::text[]) AS aggregate_id,
           unnest(@payload_hashes::text[]) AS payload_hash, unnest(@correlation_ids::text[]) AS correlation_id,
           unnest(@causation_ids::text[]) AS causation_id, unnest(@trace_ids::text[]) AS trace_id,
           generate_series(1, cardinality(@message_ids::text[])) AS ord
) AS e
ORDER BY e.ord
ON CONFLICT (consumer_name, message_id) DO NOTHING
RETURNING message_id;

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
INSERT INTO message_inbox (
    consumer_name, message_id, message_type, message_version, aggregate_id, status,
    attempt_count, payload_hash, processing_started_at, last_error_code, last_error_message,
    correlation_id, causation_id, trace_id
) VALUES (
    @consumer_name, @message_id, @message_type, @message_version, @aggregate_id, @status,
    1, @payload_hash, now(), @last_error_code, @last_error_message,
    @correlation_id, @causation_id, @trace_id
)
ON CONFLICT (consumer_name, message_id) DO UPDATE
SET status = excluded.status,
    attempt_count = message_inbox.attempt_count + CASE WHEN message_inbox.status = 'PROCESSING' THEN 0 ELSE 1 END,
    last_error_code = excluded.last_error_code,
    last_error_message = excluded.last_error_message,
    last_received_at = now()
WHERE message_inbox.status <> 'PROCESSED'
  AND (message_inbox.status <> 'PROCESSING'
       OR message_inbox.attempt_count = @held_attempt::integer
       OR message_inbox.processing_started_at < now() - make_interval(secs => @lease_seconds::float8))
RETURNING status, attempt_count;

-- name: DeleteProcessedInbox :execrows
-- Retention: PROCESSED rows older than the window (never shorter than the
-- longest replay you may do), a batch at a time.
DELETE FROM message_inbox
WHERE (consumer_name, message_id) IN (
    SELECT consumer_name, message_id FROM message_inbox
    WHERE status = 'PROCESSED' AND processed_at < now() - make_interval(secs => @retention_seconds::float8)
    LIMIT @max_rows
);

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
INSERT INTO message_inbox (
    consumer_name, message_id, message_type, message_version, aggregate_id, status,
    attempt_count, payload_hash, last_error_code, last_error_message, correlation_id, causation_id, trace_id
)
VALUES (@consumer_name, @message_id, @message_type, @message_version, nullif(@aggregate_id::text, ''), 'RETRYABLE_FAILED',
        0, @payload_hash, 'redelivered', 'an earlier delivery ended without an ack (a lost connection, a crash, a consumer timeout)',
        nullif(@correlation_id::text, ''), nullif(@causation_id::text, ''), nullif(@trace_id::text, ''))
ON CONFLICT (consumer_name, message_id) DO NOTHING;

-- name: ForgetFailedInbox :execrows
-- An operator discarded a parked message for good: its failed row goes, so
-- that the later messages of its aggregate parked behind it may be
-- replayed. A PROCESSED row is never touched.
DELETE FROM message_inbox
WHERE consumer_name = @consumer_name AND message_id = @message_id
  AND status IN ('RETRYABLE_FAILED', 'PERMANENT_FAILED', 'POISONED');
