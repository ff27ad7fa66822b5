package domain

import (
	"errors"
	"fmt"
	"strings"
)

// Sentinel errors. Other packages wrap them with %w and test them with
// errors.Is; the HTTP error handler and the consumer's failure classifier
// each map them in one place.
var (
	// ErrNotFound: the order (or other row) does not exist.
	ErrNotFound = errors.New("not found")
	// ErrValidation: input broke a rule; the error is a *ValidationError.
	ErrValidation = errors.New("validation failed")
	// ErrInvalidTransition: the state machine has no such move from the
	// current status, and the order has not moved past it either (for
	// example fulfillment.completed for an order never requested).
	ErrInvalidTransition = errors.New("invalid state transition")
	// ErrStaleTransition: the order has already moved past the status this
	// trigger starts from (a duplicate or an out-of-date message).
	ErrStaleTransition = errors.New("order has moved past this transition")
	// ErrConflict: a concurrent change won (a version check failed, or a
	// unique key is taken).
	ErrConflict = errors.New("conflict")
	// ErrUnknownMessageType and ErrUnsupportedVersion: a message this
	// service cannot read at all.
	ErrUnknownMessageType = errors.New("unknown message type")
	ErrUnsupportedVersion = errors.New("unsupported message version")
	// ErrMalformedMessage: the payload is not the JSON its type promises.
	ErrMalformedMessage = errors.New("malformed message")
)

// FieldError is one broken rule, named by the JSON path of the field.
type FieldError struct {
	Field   string `json:"field"`
	Message string `json:"message"`
}

// ValidationError lists every broken rule of one input, not just the first.
type ValidationError struct {
	Fields []FieldError
}

func (e *ValidationError) Error() string {
	parts := make([]string, len(e.Fields))
	for i, f := range e.Fields {
		parts[i] = f.Field + ": " + f.Message
	}
	return "validation failed: " + strings.Join(parts, "; ")
}

// Is makes errors.Is(err, ErrValidation) true for a *ValidationError.
func (e *ValidationError) Is(target error) bool { return target == ErrValidation }

// Add records a broken rule.
func (e *ValidationError) Add(field, format string, args ...any) {
	e.Fields = append(e.Fields, FieldError{Field: field, Message: fmt.Sprintf(format, args...)})
}

// Err returns e, or nil when no rule was broken.
func (e *ValidationError) Err() error {
	if len(e.Fields) == 0 {
		return nil
	}
	return e
}
