package outbox

// SetBeforeMark makes r call f after the broker confirmed a batch and before
// its rows are marked; an error from f stops r there, as a crash would.
func SetBeforeMark(r *Relay, f func([]Claim) error) { r.beforeMark = f }
