-- State of the two consumers that stand for other systems: the warehouse's
-- stock reservations, and the customer notifications with their webhook
-- deliveries. Each carries its own business idempotency, next to the inbox:
-- one reservation per order, one notification per (order, kind).

-- +goose Up
CREATE TABLE stock_reservation (
    order_id       uuid        PRIMARY KEY,
    reservation_id uuid        NOT NULL,
    status         text        NOT NULL CHECK (status IN ('RESERVED', 'REJECTED', 'RELEASED')),
    reason         text,
    message_id     text        NOT NULL, -- the message that created the row
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE customer_notification (
    notification_id uuid        PRIMARY KEY, -- also the webhook's Idempotency-Key
    order_id        uuid        NOT NULL,
    kind            text        NOT NULL,
    status          text        NOT NULL CHECK (status IN ('PENDING', 'SENT', 'SKIPPED', 'FAILED')),
    message_id      text        NOT NULL, -- the message that asked for it
    attempt_count   integer     NOT NULL DEFAULT 0,
    last_error      text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    sent_at         timestamptz,
    CONSTRAINT customer_notification_order_kind_key UNIQUE (order_id, kind)
);

-- +goose Down
DROP TABLE customer_notification;
DROP TABLE stock_reservation;
