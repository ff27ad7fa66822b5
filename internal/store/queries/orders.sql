-- name: CreateOrder :one
-- A new order, its lines and the first row of its history, in one
-- statement: one round trip instead of three. Set-returning functions in a
-- select list advance together, so line i takes element i of every array;
-- the foreign keys are checked at the end of the statement, when the order
-- row is there.
WITH new_order AS (
    INSERT INTO orders (order_id, customer_id, currency, status, version, total_cents)
    VALUES (@order_id, @customer_id, @currency, @status, @version, @total_cents)
    RETURNING created_at, updated_at
), new_items AS (
    INSERT INTO order_items (order_id, line_no, sku, quantity, unit_price_cents)
    SELECT @order_id::uuid,
           unnest(@line_nos::integer[]),
           unnest(@skus::text[]),
           unnest(@quantities::integer[]),
           unnest(@unit_prices_cents::bigint[])
), first_transition AS (
    -- Created when the order is: the same now() as orders.created_at.
    INSERT INTO order_state_transition (order_id, from_status, to_status, message_id, correlation_id, created_at)
    VALUES (@order_id, NULL, @status, @message_id, @correlation_id, now())
)
SELECT created_at, updated_at FROM new_order;

-- name: GetOrder :one
SELECT order_id, customer_id, currency, status, version, total_cents, created_at, updated_at
FROM orders
WHERE order_id = @order_id;

-- name: GetOrderCustomer :one
-- Whose order it is, for the API's check before it changes the order.
SELECT customer_id FROM orders WHERE order_id = @order_id;

-- name: ListOrderItems :many
SELECT order_id, line_no, sku, quantity, unit_price_cents
FROM order_items
WHERE order_id = ANY (@order_ids::uuid[])
ORDER BY order_id, line_no;

-- name: ListTransitions :many
SELECT from_status, to_status, message_id, correlation_id, reason, created_at
FROM order_state_transition
WHERE order_id = @order_id
ORDER BY transition_id;

-- name: TransitionExists :one
SELECT EXISTS (
    SELECT 1 FROM order_state_transition WHERE order_id = @order_id AND message_id = @message_id
);

-- name: ListOrders :many
-- Keyset pagination, newest first: the page after the cursor
-- (after_created_at, after_order_id). The first page passes 'infinity'.
SELECT order_id, customer_id, currency, status, version, total_cents, created_at, updated_at
FROM orders
WHERE (created_at, order_id) < (@after_created_at::timestamptz, @after_order_id::uuid)
ORDER BY created_at DESC, order_id DESC
LIMIT @max_rows;

-- name: ListOrdersByStatus :many
SELECT order_id, customer_id, currency, status, version, total_cents, created_at, updated_at
FROM orders
WHERE status = @status
  AND (created_at, order_id) < (@after_created_at::timestamptz, @after_order_id::uuid)
ORDER BY created_at DESC, order_id DESC
LIMIT @max_rows;

-- name: ListOrdersByCustomer :many
-- One customer's orders, newest first, along orders_customer_created_idx.
SELECT order_id, customer_id, currency, status, version, total_cents, created_at, updated_at
FROM orders
WHERE customer_id = @customer_id
  AND (created_at, order_id) < (@after_created_at::timestamptz, @after_order_id::uuid)
ORDER BY created_at DESC, order_id DESC
LIMIT @max_rows;

-- name: ListOrdersByCustomerAndStatus :many
SELECT order_id, customer_id, currency, status, version, total_cents, created_at, updated_at
FROM orders
WHERE customer_id = @customer_id
  AND status = @status
  AND (created_at, order_id) < (@after_created_at::timestamptz, @after_order_id::uuid)
ORDER BY created_at DESC, order_id DESC
LIMIT @max_rows;

-- name: MoveOrder :one
-- One transition in one statement: lock the order, move it if (and only
-- if) its status is one the trigger starts from, bump its version, and
-- record the move in its history (with its reason, NULL when it needs
-- none). Always returns the status the order had
-- (to explain a refusal); from_status is NULL when it did not move.
WITH current_order AS (
    SELECT orders.order_id, orders.status FROM orders WHERE orders.order_id = @order_id FOR UPDATE
), moved AS (
    UPDATE orders o
    SET status = @to_status, version = o.version + 1, updated_at = now()
    FROM current_order c
    WHERE o.order_id = c.order_id AND c.status = ANY (@from_statuses::text[])
    RETURNING o.order_id, c.status AS from_status, o.version, o.created_at, o.updated_at
), recorded AS (
    INSERT INTO order_state_transition (order_id, from_status, to_status, message_id, correlation_id, reason)
    SELECT m.order_id, m.from_status, @to_status, @message_id, @correlation_id, @reason FROM moved m
)
SELECT c.status AS current_status, m.from_status, m.version, m.created_at, m.updated_at
FROM current_order c LEFT JOIN moved m ON true;

-- name: MoveOrderFrom :one
-- MoveOrder for a trigger with one starting status: the guarded UPDATE
-- needs no lock of its own, and the history row names that status. No row
-- back means the order did not move (or does not exist).
WITH moved AS (
    UPDATE orders
    SET status = @to_status, version = version + 1, updated_at = now()
    WHERE orders.order_id = @order_id AND orders.status = @from_status
    RETURNING orders.order_id, orders.version, orders.created_at, orders.updated_at
), recorded AS (
    INSERT INTO order_state_transition (order_id, from_status, to_status, message_id, correlation_id, reason)
    SELECT m.order_id, @from_status, @to_status, @message_id, @correlation_id, @reason FROM moved m
)
SELECT m.version, m.created_at, m.updated_at FROM moved m;

-- name: GetOrderStatus :one
SELECT status FROM orders WHERE order_id = @order_id;
