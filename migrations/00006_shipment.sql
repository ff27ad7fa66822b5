-- The shipping consumer's own table: one shipment per fulfilled order,
-- ready for the carrier. One row per order is its business idempotency,
-- next to the inbox's message idempotency.

-- +goose Up
CREATE TABLE shipment (
    shipment_id uuid        PRIMARY KEY,
    order_id    uuid        NOT NULL UNIQUE,
    status      text        NOT NULL CHECK (status IN ('READY_TO_SHIP')),
    message_id  text        NOT NULL, -- the message that asked for it
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE shipment;
