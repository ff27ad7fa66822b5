package database

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Errors Translate puts in front of a driver error, so that callers match
// them with errors.Is and never import the driver for it.
var (
	// ErrNotFound: the statement returned no row (pgx.ErrNoRows).
	ErrNotFound = errors.New("no row")
	// ErrUniqueViolation: an insert or update hit a unique constraint
	// (SQLSTATE 23505).
	ErrUniqueViolation = errors.New("unique violation")
)

// Translate maps the driver's errors to ErrNotFound and ErrUniqueViolation,
// keeping the original in the chain for logs. Other errors pass unchanged.
func Translate(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("%w: %w", ErrNotFound, err)
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" {
		return fmt.Errorf("%w: %s: %w", ErrUniqueViolation, pgErr.ConstraintName, err)
	}
	return err
}

// The classification below reads an error that came from a database call.
// A network error, a deadline or a closed connection is the database's
// there; the same error from anything else (an HTTP call) is not, so do not
// ask about errors whose origin you do not know.

// TransientCode names a transient database failure with a short code
// (lock_timeout, statement_timeout, serialization_failure, deadlock,
// database_read_only, database_unavailable), or returns "" when err is not
// transient.
func TransientCode(err error) string {
	if !IsTransient(err) {
		return ""
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "25006":
			return "database_read_only"
		case "55P03":
			return "lock_timeout"
		case "57014":
			return "statement_timeout"
		case "40001":
			return "serialization_failure"
		case "40P01":
			return "deadlock"
		}
	}
	return "database_unavailable"
}

// IsTransient reports whether a database call's error is worth retrying
// later as it is: the database went away, was too busy, or picked this
// transaction as the loser of a serialization failure, a deadlock or a lock
// or statement timeout. Constraint violations, bad SQL and missing rows are
// not transient.
func IsTransient(err error) bool {
	if err == nil {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "40001", // serialization_failure
			"40P01", // deadlock_detected
			"25006", // read_only_sql_transaction (a standby, or a read-only database)
			"55P03", // lock_not_available (lock_timeout)
			"57014", // query_canceled (statement_timeout)
			"53100", // disk_full
			"53200", // out_of_memory
			"53300", // too_many_connections
			"57P01", // admin_shutdown
			"57P02", // crash_shutdown
			"57P03": // cannot_connect_now
			return true
		}
		return pgErr.Code[:2] == "08" // connection_exception class
	}
	if errors.Is(err, context.DeadlineExceeded) || pgconn.SafeToRetry(err) || pgconn.Timeout(err) {
		return true
	}
	var netErr net.Error
	if errors.As(err, &netErr) {
		return true
	}
	var connErr *pgconn.ConnectError
	return errors.As(err, &connErr) || errors.Is(err, pgx.ErrTxClosed) || isClosedConn(err)
}

func isClosedConn(err error) bool {
	// pgx reports a connection that died under a query as "conn closed" or
	// an unexpected EOF; both mean the statement may be run again.
	msg := err.Error()
	for _, sign := range []string{"conn closed", "unexpected EOF", "connection reset", "broken pipe"} {
		if strings.Contains(msg, sign) {
			return true
		}
	}
	return false
}

// IsUnavailable reports whether a database call's error says that the
// database cannot do any work right now, whatever the work: the connection
// failed, was cut or timed out; the server is shutting down or starting; it
// refuses more connections; it is out of disk or memory; it is a read-only
// standby (a failover in progress) or read-only. The same work, unchanged,
// can succeed later; nothing about the message or the request is wrong.
// Contention (deadlocks, serialization failures, lock and statement
// timeouts) is transient but not unavailability: it is about the rows this
// work touches.
func IsUnavailable(err error) bool {
	if err == nil || !IsTransient(err) {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "40001", "40P01", "55P03", "57014":
			return false
		}
	}
	return true
}

// faultError marks an error as the database's: Run marks a failed begin
// or commit, and an error of the transaction's function that the server
// gave or that the connection's death or the run's deadline caused.
type faultError struct{ err error }

func (e *faultError) Error() string { return e.err.Error() }
func (e *faultError) Unwrap() error { return e.err }

// Fault marks err as the database's (nil stays nil). Only such errors may
// stand for the database's trouble: the same network error or deadline
// from anything else (a call to another system) is that call's failure.
func Fault(err error) error {
	if err == nil || IsFault(err) {
		return err
	}
	return &faultError{err}
}

// IsFault reports whether err was marked as the database's (Fault).
func IsFault(err error) bool {
	var e *faultError
	return errors.As(err, &e)
}
