package store

import (
	"errors"
	"fmt"

	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/domain"
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
