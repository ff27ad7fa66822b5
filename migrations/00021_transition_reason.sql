-- Why an order made a transition, when the move itself does not say:
-- the consumer that rejects an order writes the warehouse's reason ("out
-- of stock: OOS-1") with the REJECTED row, in the same statement. NULL
-- for every other move, and for the rows written before this column.

-- +goose Up
ALTER TABLE order_state_transition ADD COLUMN reason text;
-- The one statement that moves an order (store.MoveOrder) writes it, so
-- both roles that move orders insert it: order-consumer and order-api
-- (whose cancel has no reason: NULL). Both roles that read the history
-- read the whole table already.
GRANT INSERT (reason) ON order_state_transition TO orders_consumer, orders_api;

-- +goose Down
REVOKE INSERT (reason) ON order_state_transition FROM orders_consumer, orders_api;
ALTER TABLE order_state_transition DROP COLUMN reason;
