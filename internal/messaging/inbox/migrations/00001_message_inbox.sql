-- The consumer inbox: one row per (consumer_name, message_id), written in the
-- same transaction as the business effect of the message. The primary key is
-- the deduplication guard: a second delivery of a message finds the row and
-- applies nothing.
--
-- Row life cycle (see docs/state-machines.md):
--   (none) --first delivery--> PROCESSING --commit--> PROCESSED
--   PROCESSING --transient failure--> RETRYABLE_FAILED --retry delivered--> PROCESSING
--   PROCESSING --invalid message or impossible transition--> PERMANENT_FAILED (parked)
--   PROCESSING --transient failure, attempts exhausted--> POISONED (parked)
--   PERMANENT_FAILED, POISONED --replayed from the parking lot--> PROCESSING
-- A row is committed as PROCESSING only by a two-step handler (notification:
-- intent recorded, external call pending); otherwise PROCESSING lives and
-- dies inside the transaction of the effect.
--
-- The payload itself is not kept (it may hold personal data; the parking lot
-- keeps failed messages whole): payload_hash tells a redelivery from a
-- different message that reuses an id.

-- +goose Up
CREATE TABLE message_inbox (
    consumer_name         text        NOT NULL,
    message_id            text        NOT NULL,
    message_type          text        NOT NULL,
    message_version       integer     NOT NULL,
    aggregate_id          text,
    status                text        NOT NULL CHECK (status IN ('PROCESSING', 'PROCESSED', 'RETRYABLE_FAILED', 'PERMANENT_FAILED', 'POISONED')),
    outcome               text        CHECK (outcome IN ('APPLIED', 'IGNORED')), -- set when PROCESSED
    outcome_reason        text,       -- why an IGNORED message changed nothing
    attempt_count         integer     NOT NULL DEFAULT 1 CHECK (attempt_count >= 0),
    payload_hash          text        NOT NULL,
    first_received_at     timestamptz NOT NULL DEFAULT now(),
    last_received_at      timestamptz NOT NULL DEFAULT now(),
    processing_started_at timestamptz,
    processed_at          timestamptz,
    last_error_code       text,
    last_error_message    text,
    correlation_id        text,
    causation_id          text,
    trace_id              text,
    PRIMARY KEY (consumer_name, message_id)
);

-- Stuck and failed rows by age (dashboards, alerts, the runbook queries).
CREATE INDEX message_inbox_unprocessed_idx ON message_inbox (consumer_name, status, first_received_at) WHERE status <> 'PROCESSED';
-- Everything a consumer saw about one order.
CREATE INDEX message_inbox_aggregate_idx ON message_inbox (aggregate_id, first_received_at);
-- Retention of processed rows (never shorter than the replay window).
CREATE INDEX message_inbox_processed_idx ON message_inbox (processed_at) WHERE status = 'PROCESSED';

-- +goose Down
DROP TABLE message_inbox;
