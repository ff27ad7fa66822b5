package domain

import "fmt"

// Status is where an order stands.
type Status string

const (
	StatusSubmitted            Status = "SUBMITTED"
	StatusFulfillmentRequested Status = "FULFILLMENT_REQUESTED"
	StatusFulfilled            Status = "FULFILLED"
	StatusRejected             Status = "REJECTED"
	StatusCancelled            Status = "CANCELLED"
)

// Statuses lists every status, in life-cycle order.
var Statuses = []Status{StatusSubmitted, StatusFulfillmentRequested, StatusFulfilled, StatusRejected, StatusCancelled}

// ParseStatus reads a status name.
func ParseStatus(s string) (Status, error) {
	for _, st := range Statuses {
		if string(st) == s {
			return st, nil
		}
	}
	return "", fmt.Errorf("unknown order status %q", s)
}

// Final reports whether no transition leaves s.
func (s Status) Final() bool { return stage[s] == stageFinal }

// Trigger is what moves an order: a message its consumer handles, or the
// cancel command of the HTTP API.
type Trigger string

const (
	// TriggerSubmitted: the fulfillment consumer handles order.submitted.
	TriggerSubmitted Trigger = Trigger(TypeOrderSubmitted)
	// TriggerFulfillmentCompleted: the warehouse reserved the stock.
	TriggerFulfillmentCompleted Trigger = Trigger(TypeFulfillmentCompleted)
	// TriggerFulfillmentRejected: the warehouse could not.
	TriggerFulfillmentRejected Trigger = Trigger(TypeFulfillmentRejected)
	// TriggerCancel: POST /v1/orders/{id}/cancel.
	TriggerCancel Trigger = "cancel"
)

// Transition is one allowed move of the state machine.
type Transition struct {
	From Status
	On   Trigger
	To   Status
}

// Transitions is the order state machine: every allowed move, and nothing
// else. docs/state-machines.md draws the same table.
var Transitions = []Transition{
	{From: StatusSubmitted, On: TriggerSubmitted, To: StatusFulfillmentRequested},
	{From: StatusFulfillmentRequested, On: TriggerFulfillmentCompleted, To: StatusFulfilled},
	{From: StatusFulfillmentRequested, On: TriggerFulfillmentRejected, To: StatusRejected},
	{From: StatusSubmitted, On: TriggerCancel, To: StatusCancelled},
	{From: StatusFulfillmentRequested, On: TriggerCancel, To: StatusCancelled},
}

// The stages order the statuses, so that a trigger that finds the order
// further along than any status it starts from can be told apart (stale:
// acknowledge and ignore) from one that finds it not yet there (impossible:
// park the message).
const (
	stageNew = iota
	stageInFulfillment
	stageFinal
)

var stage = map[Status]int{
	StatusSubmitted:            stageNew,
	StatusFulfillmentRequested: stageInFulfillment,
	StatusFulfilled:            stageFinal,
	StatusRejected:             stageFinal,
	StatusCancelled:            stageFinal,
}

// Next returns the status trigger t moves an order in status from to.
//
// When the table has no such move, the error wraps ErrStaleTransition if
// the order already stands past every status t starts from (it has moved
// on: a duplicate, a late message, a cancel that won a race), and
// ErrInvalidTransition otherwise (t is not possible yet, nor ever was).
func Next(from Status, t Trigger) (Status, error) {
	latestStart := -1
	for _, tr := range Transitions {
		if tr.On != t {
			continue
		}
		if tr.From == from {
			return tr.To, nil
		}
		latestStart = max(latestStart, stage[tr.From])
	}
	if _, known := stage[from]; !known || latestStart < 0 {
		return "", fmt.Errorf("%w: %q from %s", ErrInvalidTransition, t, from)
	}
	if stage[from] > latestStart {
		return "", fmt.Errorf("%w: %q from %s", ErrStaleTransition, t, from)
	}
	return "", fmt.Errorf("%w: %q from %s", ErrInvalidTransition, t, from)
}

// Target returns where trigger t leads and every status it may start
// from. Each trigger has one target in the table (TestTransitionsTableIsConsistent),
// so a store can apply it as one guarded update.
func Target(t Trigger) (to Status, from []Status, err error) {
	for _, tr := range Transitions {
		if tr.On == t {
			to = tr.To
			from = append(from, tr.From)
		}
	}
	if len(from) == 0 {
		return "", nil, fmt.Errorf("%w: no transition on %q", ErrInvalidTransition, t)
	}
	return to, from, nil
}
