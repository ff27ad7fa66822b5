package messaging

import "github.com/yourorg/orders/internal/store"

// SetBeforeMark makes r call f after the broker confirmed a batch and before
// its rows are marked; an error from f stops r there, as a crash would.
func SetBeforeMark(r *Relay, f func([]store.Claim) error) { r.beforeMark = f }

// SetAfterCommit makes cs call f between a delivery's commit and its ack.
func SetAfterCommit(cs *Consumers, f func(*Delivery)) { cs.afterCommit = f }

// SetExit replaces os.Exit for the crash-after-commit fault.
func SetExit(cs *Consumers, exit func(int)) { cs.exit = exit }
