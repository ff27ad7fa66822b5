package outbox

// BeforeMark is a Faults whose BeforeMark calls the function.
type BeforeMark func([]Claim) error

func (f BeforeMark) BeforeMark(published []Claim) error { return f(published) }
