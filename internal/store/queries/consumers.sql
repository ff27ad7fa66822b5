-- name: InsertReservation :one
-- One reservation per order, whoever asks first; no row back means the
-- order already has one.
INSERT INTO stock_reservation (order_id, reservation_id, status, reason, message_id)
VALUES (@order_id, @reservation_id, @status, @reason, @message_id)
ON CONFLICT (order_id) DO NOTHING
RETURNING reservation_id;

-- name: GetReservationForUpdate :one
SELECT order_id, reservation_id, status, reason, message_id
FROM stock_reservation WHERE order_id = @order_id FOR UPDATE;

-- name: ReleaseReservation :exec
UPDATE stock_reservation SET status = 'RELEASED', updated_at = now() WHERE order_id = @order_id;

-- name: InsertNotification :one
-- One notification per (order, kind); no row back means it exists.
INSERT INTO customer_notification (notification_id, order_id, kind, status, message_id)
VALUES (@notification_id, @order_id, @kind, @status, @message_id)
ON CONFLICT (order_id, kind) DO NOTHING
RETURNING notification_id;

-- name: GetNotificationForUpdate :one
SELECT notification_id, order_id, kind, status, message_id, attempt_count
FROM customer_notification WHERE order_id = @order_id AND kind = @kind FOR UPDATE;

-- name: RecordNotificationAttempt :exec
UPDATE customer_notification
SET status = @status, attempt_count = attempt_count + 1, last_error = @last_error,
    sent_at = CASE WHEN @status = 'SENT' THEN now() ELSE sent_at END
WHERE notification_id = @notification_id;
