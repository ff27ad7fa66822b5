package notification

import (
	"context"
	"fmt"

	"github.com/google/uuid"

	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/store"
)

// The notifier's own table, customer_notification
// (migrations/00005_consumer_state.sql): one notification per (order,
// kind), whose id is the Idempotency-Key of every webhook call for it.

// notification is one customer notification.
type notification struct {
	ID        uuid.UUID // also the Idempotency-Key of its webhook calls
	OrderID   uuid.UUID
	Kind      string
	Status    string // PENDING, SENT, SKIPPED or FAILED
	MessageID string
	Attempts  int
}

// createNotification inserts n unless the order has a notification of
// that kind already, and reports whether it did.
func createNotification(ctx context.Context, tx database.DBTX, n notification) (bool, error) {
	tag, err := tx.Exec(ctx, `
		INSERT INTO customer_notification (notification_id, order_id, kind, status, message_id)
		VALUES ($1, $2, $3, $4, $5)
		ON CONFLICT (order_id, kind) DO NOTHING`,
		n.ID, n.OrderID, n.Kind, n.Status, n.MessageID)
	if err != nil {
		return false, fmt.Errorf("insert %s notification of order %s: %w", n.Kind, n.OrderID, store.Translate(err))
	}
	return tag.RowsAffected() == 1, nil
}

// lockNotification reads and locks the notification of an order of a kind
// (domain.ErrNotFound when there is none).
func lockNotification(ctx context.Context, tx database.DBTX, orderID uuid.UUID, kind string) (*notification, error) {
	n := notification{OrderID: orderID, Kind: kind}
	err := tx.QueryRow(ctx, `
		SELECT notification_id, status, message_id, attempt_count
		FROM customer_notification WHERE order_id = $1 AND kind = $2 FOR UPDATE`, orderID, kind).
		Scan(&n.ID, &n.Status, &n.MessageID, &n.Attempts)
	if err != nil {
		return nil, fmt.Errorf("lock %s notification of order %s: %w", kind, orderID, store.Translate(err))
	}
	return &n, nil
}

// recordNotificationAttempt records one delivery attempt of a notification
// and its result: SENT, or still PENDING (retry), or FAILED, with the error.
// A SENT notification stays SENT, whatever a late attempt says.
func recordNotificationAttempt(ctx context.Context, db database.DBTX, id uuid.UUID, status, lastError string) error {
	_, err := db.Exec(ctx, `
		UPDATE customer_notification
		SET status = $1, attempt_count = attempt_count + 1, last_error = $2,
		    sent_at = CASE WHEN $1 = 'SENT' THEN now() ELSE sent_at END
		WHERE notification_id = $3 AND status <> 'SENT'`, status, database.NilIfEmpty(lastError), id)
	if err != nil {
		return fmt.Errorf("record notification attempt: %w", store.Translate(err))
	}
	return nil
}
