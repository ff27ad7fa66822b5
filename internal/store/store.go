package store

import (
	"errors"
	"fmt"

	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/domain"
	"github.com/yourorg/orders/internal/messaging/outbox"
	"github.com/yourorg/orders/internal/store/dbsqlc"
)

var queries = dbsqlc.New()

// Translate maps driver errors to the domain's sentinel errors, keeping the
// original in the chain for logs: no row is domain.ErrNotFound, a unique
// violation domain.ErrConflict.
func Translate(err error) error {
	err = database.Translate(err)
	switch {
	case errors.Is(err, database.ErrNotFound):
		return fmt.Errorf("%w: %w", domain.ErrNotFound, err)
	case errors.Is(err, database.ErrUniqueViolation):
		return fmt.Errorf("%w: %w", domain.ErrConflict, err)
	}
	return err
}

// OutboxWriter is the writer of the order service's messages: published
// to domain.EventsExchange, routed by their type, about orders. producer
// names the process (the messages' app_id).
func OutboxWriter(producer string) outbox.Writer {
	return outbox.Writer{Producer: producer, Exchange: domain.EventsExchange, AggregateType: domain.AggregateOrder}
}
