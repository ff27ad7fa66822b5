-- Orders, their items and their state history.
--
-- Every status change of an order is a guarded UPDATE of orders
-- (WHERE status = <expected> AND version = <expected>) plus one row in
-- order_state_transition, in the same transaction. The unique key
-- (order_id, message_id) makes "apply this message to this order" happen at
-- most once even if every other guard failed.

-- +goose Up
CREATE TABLE orders (
    order_id    uuid        PRIMARY KEY,
    customer_id text        NOT NULL CHECK (char_length(customer_id) BETWEEN 1 AND 64),
    currency    text        NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    status      text        NOT NULL CHECK (status IN ('SUBMITTED', 'FULFILLMENT_REQUESTED', 'FULFILLED', 'REJECTED', 'CANCELLED')),
    version     integer     NOT NULL DEFAULT 1 CHECK (version >= 1),
    total_cents bigint      NOT NULL CHECK (total_cents >= 0),
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- Keyset pagination, newest first, with and without a status filter.
CREATE INDEX orders_created_idx ON orders (created_at DESC, order_id DESC);
CREATE INDEX orders_status_created_idx ON orders (status, created_at DESC, order_id DESC);

CREATE TABLE order_items (
    order_id         uuid    NOT NULL REFERENCES orders (order_id) ON DELETE CASCADE,
    line_no          integer NOT NULL CHECK (line_no >= 1),
    sku              text    NOT NULL CHECK (char_length(sku) BETWEEN 1 AND 64),
    quantity         integer NOT NULL CHECK (quantity BETWEEN 1 AND 10000),
    unit_price_cents bigint  NOT NULL CHECK (unit_price_cents BETWEEN 0 AND 1000000000),
    PRIMARY KEY (order_id, line_no)
);

CREATE TABLE order_state_transition (
    transition_id  bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    order_id       uuid        NOT NULL REFERENCES orders (order_id) ON DELETE CASCADE,
    from_status    text,       -- NULL for the creation of the order
    to_status      text        NOT NULL,
    message_id     text,       -- NULL when an HTTP request caused the change
    correlation_id text,
    created_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT order_state_transition_order_message_key UNIQUE (order_id, message_id)
);

CREATE INDEX order_state_transition_order_idx ON order_state_transition (order_id, transition_id);

-- +goose Down
DROP TABLE order_state_transition;
DROP TABLE order_items;
DROP TABLE orders;
