package inbox

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/yourorg/orders/internal/database"
)

// dbError marks an error as the database's: it came from a statement of
// the inbox's own, from a transaction's begin or commit, or from a handler
// whose transaction's connection died or ran out of time under it. Only
// such errors may hold deliveries (the database is away: untilWritable) or
// count as the infrastructure's trouble (no retry budget spent, a
// database_* reason code). The same network error or deadline from
// anything else (an external call) is the handler's failure, classified
// like any other.
type dbError struct{ err error }

func (e *dbError) Error() string { return e.err.Error() }
func (e *dbError) Unwrap() error { return e.err }

// fromDatabase marks err as the database's (nil stays nil).
func fromDatabase(err error) error {
	if err == nil || isDatabase(err) {
		return err
	}
	return &dbError{err}
}

// isDatabase reports whether err was marked as the database's.
func isDatabase(err error) bool {
	var e *dbError
	return errors.As(err, &e)
}

// dbTransient reports whether err is the database's, and transient.
func dbTransient(err error) bool { return isDatabase(err) && database.IsTransient(err) }

// dbUnavailable reports whether err is the database's, and says it is
// unavailable.
func dbUnavailable(err error) bool { return isDatabase(err) && database.IsUnavailable(err) }

// classifyTxError marks the error a transaction function returned as the
// database's when it is: a server error, a failed connect, or any error
// once the transaction's connection has died or its deadline passed (a
// handler's statement failed under it).
func classifyTxError(txCtx context.Context, tx pgx.Tx, err error) error {
	if err == nil {
		return nil
	}
	var pgErr *pgconn.PgError
	var connErr *pgconn.ConnectError
	if errors.As(err, &pgErr) || errors.As(err, &connErr) || tx.Conn().IsClosed() || txCtx.Err() != nil {
		return fromDatabase(err)
	}
	return err
}
