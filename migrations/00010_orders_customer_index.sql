-- A customer lists its own orders (GET /v1/orders with a customer's
-- token): ListOrdersByCustomer and ListOrdersByCustomerAndStatus. Without
-- an index that leads with customer_id, each page walks orders_created_idx
-- newest first and skips every other customer's orders.
--
-- CONCURRENTLY, so that building it on a live table blocks no writes; it
-- cannot run in a transaction. A build that fails (a deadlock, a cancel)
-- leaves an INVALID index behind: drop it, and run the migration again.

-- +goose NO TRANSACTION

-- +goose Up
CREATE INDEX CONCURRENTLY orders_customer_created_idx ON orders (customer_id, created_at DESC, order_id DESC);

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS orders_customer_created_idx;
