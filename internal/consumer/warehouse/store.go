package warehouse

import (
	"context"
	"fmt"

	"github.com/google/uuid"

	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/store"
)

// The warehouse's own table, stock_reservation
// (migrations/00005_consumer_state.sql): one reservation per order.

// reservation is the warehouse's stock reservation for an order.
type reservation struct {
	OrderID       uuid.UUID
	ReservationID uuid.UUID
	Status        string // RESERVED, REJECTED or RELEASED
	Reason        string
	MessageID     string // the message that created it
}

// createReservation inserts r unless the order has a reservation already
// (whoever asks first wins), and reports whether it did.
func createReservation(ctx context.Context, tx database.DBTX, r reservation) (bool, error) {
	tag, err := tx.Exec(ctx, `
		INSERT INTO stock_reservation (order_id, reservation_id, status, reason, message_id)
		VALUES ($1, $2, $3, $4, $5)
		ON CONFLICT (order_id) DO NOTHING`,
		r.OrderID, r.ReservationID, r.Status, database.NilIfEmpty(r.Reason), r.MessageID)
	if err != nil {
		return false, fmt.Errorf("insert reservation of order %s: %w", r.OrderID, store.Translate(err))
	}
	return tag.RowsAffected() == 1, nil
}

// lockReservation reads and locks the reservation of an order
// (domain.ErrNotFound when it has none).
func lockReservation(ctx context.Context, tx database.DBTX, orderID uuid.UUID) (*reservation, error) {
	r := reservation{OrderID: orderID}
	var reason *string
	err := tx.QueryRow(ctx, `
		SELECT reservation_id, status, reason, message_id
		FROM stock_reservation WHERE order_id = $1 FOR UPDATE`, orderID).
		Scan(&r.ReservationID, &r.Status, &reason, &r.MessageID)
	if err != nil {
		return nil, fmt.Errorf("lock reservation of order %s: %w", orderID, store.Translate(err))
	}
	r.Reason = database.Deref(reason)
	return &r, nil
}

// releaseReservation marks the reservation of an order RELEASED.
func releaseReservation(ctx context.Context, tx database.DBTX, orderID uuid.UUID) error {
	_, err := tx.Exec(ctx, `UPDATE stock_reservation SET status = 'RELEASED', updated_at = now() WHERE order_id = $1`, orderID)
	if err != nil {
		return fmt.Errorf("release reservation of order %s: %w", orderID, store.Translate(err))
	}
	return nil
}
