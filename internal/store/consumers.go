package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"

	"github.com/yourorg/orders/internal/domain"
	"github.com/yourorg/orders/internal/store/dbsqlc"
)

// Reservation is the warehouse's stock reservation for an order.
type Reservation struct {
	OrderID       uuid.UUID
	ReservationID uuid.UUID
	Status        string // RESERVED, REJECTED or RELEASED
	Reason        string
	MessageID     string // the message that created it
}

// CreateReservation inserts r unless the order has a reservation already,
// and reports whether it did.
func CreateReservation(ctx context.Context, tx DBTX, r Reservation) (bool, error) {
	_, err := queries.InsertReservation(ctx, tx, dbsqlc.InsertReservationParams{
		OrderID: r.OrderID, ReservationID: r.ReservationID, Status: r.Status, Reason: nullIfEmpty(r.Reason), MessageID: r.MessageID,
	})
	if err = translate(err); errors.Is(err, domain.ErrNotFound) {
		return false, nil
	} else if err != nil {
		return false, fmt.Errorf("insert reservation of order %s: %w", r.OrderID, err)
	}
	return true, nil
}

// LockReservation reads and locks the reservation of an order
// (domain.ErrNotFound when it has none).
func LockReservation(ctx context.Context, tx DBTX, orderID uuid.UUID) (*Reservation, error) {
	row, err := queries.GetReservationForUpdate(ctx, tx, orderID)
	if err != nil {
		return nil, fmt.Errorf("lock reservation of order %s: %w", orderID, translate(err))
	}
	return &Reservation{OrderID: row.OrderID, ReservationID: row.ReservationID, Status: row.Status, Reason: deref(row.Reason), MessageID: row.MessageID}, nil
}

// ReleaseReservation marks the reservation of an order RELEASED.
func ReleaseReservation(ctx context.Context, tx DBTX, orderID uuid.UUID) error {
	if err := queries.ReleaseReservation(ctx, tx, orderID); err != nil {
		return fmt.Errorf("release reservation of order %s: %w", orderID, translate(err))
	}
	return nil
}

// Notification is one customer notification: at most one per (order, kind).
type Notification struct {
	ID        uuid.UUID // also the Idempotency-Key of its webhook calls
	OrderID   uuid.UUID
	Kind      string
	Status    string // PENDING, SENT, SKIPPED or FAILED
	MessageID string
	Attempts  int
}

// CreateNotification inserts n unless the order has a notification of that
// kind already, and reports whether it did.
func CreateNotification(ctx context.Context, tx DBTX, n Notification) (bool, error) {
	_, err := queries.InsertNotification(ctx, tx, dbsqlc.InsertNotificationParams{
		NotificationID: n.ID, OrderID: n.OrderID, Kind: n.Kind, Status: n.Status, MessageID: n.MessageID,
	})
	if err = translate(err); errors.Is(err, domain.ErrNotFound) {
		return false, nil
	} else if err != nil {
		return false, fmt.Errorf("insert %s notification of order %s: %w", n.Kind, n.OrderID, err)
	}
	return true, nil
}

// LockNotification reads and locks the notification of an order of a kind.
func LockNotification(ctx context.Context, tx DBTX, orderID uuid.UUID, kind string) (*Notification, error) {
	row, err := queries.GetNotificationForUpdate(ctx, tx, dbsqlc.GetNotificationForUpdateParams{OrderID: orderID, Kind: kind})
	if err != nil {
		return nil, fmt.Errorf("lock %s notification of order %s: %w", kind, orderID, translate(err))
	}
	return &Notification{ID: row.NotificationID, OrderID: row.OrderID, Kind: row.Kind, Status: row.Status,
		MessageID: row.MessageID, Attempts: int(row.AttemptCount)}, nil
}

// RecordNotificationAttempt records one delivery attempt of a notification
// and its result: SENT, or still PENDING (retry), or FAILED, with the error.
func RecordNotificationAttempt(ctx context.Context, db DBTX, id uuid.UUID, status, lastError string) error {
	err := queries.RecordNotificationAttempt(ctx, db, dbsqlc.RecordNotificationAttemptParams{
		Status: status, LastError: nullIfEmpty(lastError), NotificationID: id,
	})
	if err != nil {
		return fmt.Errorf("record notification attempt: %w", translate(err))
	}
	return nil
}
