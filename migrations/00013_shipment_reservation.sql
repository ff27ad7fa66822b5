-- A shipment names the warehouse's reservation of its order's stock, which
-- it is picked from: version 2 of order.fulfilled carries it
-- (docs/extending.md, "Evolve a message"). A shipment made from a version
-- 1 message, which names no reservation, has none (NULL).

-- +goose Up
ALTER TABLE shipment ADD COLUMN reservation_id uuid;
-- The shipping consumer writes it with the shipment (docs/security.md).
GRANT INSERT (reservation_id) ON shipment TO orders_consumer;

-- +goose Down
REVOKE INSERT (reservation_id) ON shipment FROM orders_consumer;
ALTER TABLE shipment DROP COLUMN reservation_id;
