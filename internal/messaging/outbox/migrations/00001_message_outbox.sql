-- The transactional outbox: a message to publish, written in the same
-- transaction as the business change that caused it.
--
-- Row life cycle (see docs/state-machines.md):
--   PENDING --claimed by a relay--> PUBLISHING --broker confirm--> PUBLISHED
--   PUBLISHING --nack, return or timeout--> PENDING (next_attempt_at in the future)
--   PUBLISHING --attempts exhausted--> FAILED
--   PUBLISHING --lease expired (relay died)--> PENDING
--
-- outbox_id is the AMQP message_id: it never changes, however often the row
-- is published again, so consumers can deduplicate on it.

-- +goose Up
CREATE TABLE message_outbox (
    outbox_id       uuid        PRIMARY KEY,
    aggregate_type  text        NOT NULL,
    aggregate_id    text        NOT NULL,
    message_type    text        NOT NULL,
    message_version integer     NOT NULL CHECK (message_version >= 1),
    exchange_name   text        NOT NULL,
    routing_key     text        NOT NULL,
    payload         jsonb       NOT NULL,
    headers         jsonb       NOT NULL DEFAULT '{}'::jsonb,
    status          text        NOT NULL DEFAULT 'PENDING' CHECK (status IN ('PENDING', 'PUBLISHING', 'PUBLISHED', 'FAILED')),
    attempt_count   integer     NOT NULL DEFAULT 0 CHECK (attempt_count >= 0),
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    claimed_by      text,       -- relay instance holding the row while PUBLISHING
    claimed_until   timestamptz, -- lease: after this the row may be taken back
    published_at    timestamptz,
    last_error      text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT message_outbox_claim_check CHECK ((status = 'PUBLISHING') = (claimed_by IS NOT NULL AND claimed_until IS NOT NULL))
);

-- The claim query: PENDING rows, oldest first (those waiting for a retry,
-- next_attempt_at in the future, are filtered out as the scan meets them).
-- Partial, so it stays as small as the backlog however many PUBLISHED rows
-- the table keeps.
CREATE INDEX message_outbox_pending_idx ON message_outbox (created_at, outbox_id) WHERE status = 'PENDING';
-- Lease recovery: PUBLISHING rows whose relay went away.
CREATE INDEX message_outbox_publishing_idx ON message_outbox (claimed_until) WHERE status = 'PUBLISHING';
-- Operators: every message of one order. (No index on the correlation id:
-- every claim and mark rewrites the row, and each index costs on that hot
-- path; a correlation id leads to its order through order_state_transition
-- and the logs. docs/benchmarks.md has the measurement.)
CREATE INDEX message_outbox_aggregate_idx ON message_outbox (aggregate_type, aggregate_id, created_at);
-- Retention of published rows, and the FAILED rows an operator must look at.
CREATE INDEX message_outbox_published_idx ON message_outbox (published_at) WHERE status = 'PUBLISHED';
CREATE INDEX message_outbox_failed_idx ON message_outbox (updated_at) WHERE status = 'FAILED';

-- Wake the relays when outbox rows commit. A statement-level trigger with a
-- constant payload: PostgreSQL folds identical notifications of one
-- transaction into one, so a transaction costs one NOTIFY however many rows
-- it inserts. NOTIFY is only a hint; the relay also polls.
-- +goose StatementBegin
CREATE FUNCTION message_outbox_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('message_outbox', '');
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

CREATE TRIGGER message_outbox_notify
    AFTER INSERT ON message_outbox
    FOR EACH STATEMENT EXECUTE FUNCTION message_outbox_notify();

-- +goose Down
DROP TRIGGER message_outbox_notify ON message_outbox;
DROP FUNCTION message_outbox_notify();
DROP TABLE message_outbox;
