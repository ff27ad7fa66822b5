-- name: InsertOrder :one
INSERT INTO orders (order_id, customer_id, currency, status, version, total_cents)
VALUES (@order_id, @customer_id, @currency, @status, @version, @total_cents)
RETURNING created_at, updated_at;

-- name: InsertOrderItems :exec
-- All lines of an order in one statement. Set-returning functions in a
-- select list advance together, so row i takes element i of every array.
INSERT INTO order_items (order_id, line_no, sku, quantity, unit_price_cents)
SELECT @order_id::uuid,
       unnest(@line_nos::integer[]),
       unnest(@skus::text[]),
       unnest(@quantities::integer[]),
       unnest(@unit_prices_cents::bigint[]);

-- name: GetOrder :one
SELECT order_id, customer_id, currency, status, version, total_cents, created_at, updated_at
FROM orders
WHERE order_id = @order_id;

-- name: GetOrderForUpdate :one
-- Locks the order until the transaction ends: the guard that keeps two
-- concurrent triggers (a cancel and a fulfillment, say) from both winning.
SELECT order_id, customer_id, currency, status, version, total_cents, created_at, updated_at
FROM orders
WHERE order_id = @order_id
FOR UPDATE;

-- name: UpdateOrderStatus :one
-- The guarded update: it moves the order only from the status and version
-- the caller saw, and reports no row when anything changed in between.
UPDATE orders
SET status = @to_status, version = version + 1, updated_at = now()
WHERE order_id = @order_id AND status = @from_status AND version = @version
RETURNING version, updated_at;

-- name: ListOrderItems :many
SELECT order_id, line_no, sku, quantity, unit_price_cents
FROM order_items
WHERE order_id = ANY (@order_ids::uuid[])
ORDER BY order_id, line_no;

-- name: InsertTransition :exec
INSERT INTO order_state_transition (order_id, from_status, to_status, message_id, correlation_id)
VALUES (@order_id, @from_status, @to_status, @message_id, @correlation_id);

-- name: ListTransitions :many
SELECT from_status, to_status, message_id, correlation_id, created_at
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
