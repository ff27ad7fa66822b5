-- What operators did by hand: every orderctl command that changes state
-- (an outbox retry, a replay or a discard from a parking lot, a retention
-- run) writes one row here, who, when, what and why. It outlives the rows it
-- is about: an audit note in message_outbox.last_error is gone once the row
-- publishes, and a discarded message is gone from the broker.

-- +goose Up
CREATE TABLE operator_audit (
    audit_id    bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at          timestamptz NOT NULL DEFAULT now(),
    actor       text        NOT NULL CHECK (actor <> ''),  -- ORDERCTL_USER, or the OS user
    action      text        NOT NULL,                      -- e.g. outbox.retry, parked.replay
    target      text        NOT NULL,                      -- what it acted on: an outbox id, a consumer and message id
    reason      text        NOT NULL CHECK (reason <> ''), -- why, as the operator wrote it
    details     jsonb       NOT NULL DEFAULT '{}'::jsonb   -- what it changed: ids, counts
);

CREATE INDEX operator_audit_at_idx ON operator_audit (at DESC);

-- +goose Down
DROP TABLE operator_audit;
