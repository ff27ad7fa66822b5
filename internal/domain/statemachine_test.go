package domain_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/yourorg/orders/internal/domain"
)

// TestNext walks every (status, trigger) pair: each allowed move, and for
// every other pair whether it is stale (acknowledge, ignore) or invalid
// (park, or 409 for the API).
func TestNext(t *testing.T) {
	t.Parallel()
	const (
		stale   = "stale"
		invalid = "invalid"
	)
	type S = domain.Status
	cases := []struct {
		from S
		on   domain.Trigger
		want string // a status, or stale, or invalid
	}{
		{domain.StatusSubmitted, domain.TriggerSubmitted, string(domain.StatusFulfillmentRequested)},
		{domain.StatusSubmitted, domain.TriggerFulfillmentCompleted, invalid},
		{domain.StatusSubmitted, domain.TriggerFulfillmentRejected, invalid},
		{domain.StatusSubmitted, domain.TriggerCancel, string(domain.StatusCancelled)},

		{domain.StatusFulfillmentRequested, domain.TriggerSubmitted, stale},
		{domain.StatusFulfillmentRequested, domain.TriggerFulfillmentCompleted, string(domain.StatusFulfilled)},
		{domain.StatusFulfillmentRequested, domain.TriggerFulfillmentRejected, string(domain.StatusRejected)},
		{domain.StatusFulfillmentRequested, domain.TriggerCancel, string(domain.StatusCancelled)},

		{domain.StatusFulfilled, domain.TriggerSubmitted, stale},
		{domain.StatusFulfilled, domain.TriggerFulfillmentCompleted, stale},
		{domain.StatusFulfilled, domain.TriggerFulfillmentRejected, stale},
		{domain.StatusFulfilled, domain.TriggerCancel, stale},

		{domain.StatusRejected, domain.TriggerSubmitted, stale},
		{domain.StatusRejected, domain.TriggerFulfillmentCompleted, stale},
		{domain.StatusRejected, domain.TriggerFulfillmentRejected, stale},
		{domain.StatusRejected, domain.TriggerCancel, stale},

		{domain.StatusCancelled, domain.TriggerSubmitted, stale},
		{domain.StatusCancelled, domain.TriggerFulfillmentCompleted, stale},
		{domain.StatusCancelled, domain.TriggerFulfillmentRejected, stale},
		{domain.StatusCancelled, domain.TriggerCancel, stale},

		{"BOGUS", domain.TriggerSubmitted, invalid},
		{domain.StatusSubmitted, "order.bogus", invalid},
	}
	// Every status x trigger pair of the machine is in the table above.
	seen := map[string]bool{}
	for _, c := range cases {
		seen[fmt.Sprint(c.from, c.on)] = true
	}
	for _, s := range domain.Statuses {
		for _, tr := range []domain.Trigger{domain.TriggerSubmitted, domain.TriggerFulfillmentCompleted, domain.TriggerFulfillmentRejected, domain.TriggerCancel} {
			if !seen[fmt.Sprint(s, tr)] {
				t.Errorf("no case for %s on %s", s, tr)
			}
		}
	}

	for _, c := range cases {
		t.Run(fmt.Sprintf("%s/%s", c.from, c.on), func(t *testing.T) {
			t.Parallel()
			to, err := domain.Next(c.from, c.on)
			switch c.want {
			case stale:
				if !errors.Is(err, domain.ErrStaleTransition) {
					t.Fatalf("Next = %q, %v; want ErrStaleTransition", to, err)
				}
			case invalid:
				if !errors.Is(err, domain.ErrInvalidTransition) {
					t.Fatalf("Next = %q, %v; want ErrInvalidTransition", to, err)
				}
			default:
				if err != nil || string(to) != c.want {
					t.Fatalf("Next = %q, %v; want %s", to, err, c.want)
				}
			}
		})
	}
}

func TestTransitionsTableIsConsistent(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for _, tr := range domain.Transitions {
		key := fmt.Sprint(tr.From, tr.On)
		if seen[key] {
			t.Errorf("two transitions from %s on %s", tr.From, tr.On)
		}
		seen[key] = true
		if tr.From.Final() {
			t.Errorf("transition out of final status %s", tr.From)
		}
	}
	// One target per trigger: what lets the store apply a trigger as one
	// guarded update.
	targets := map[domain.Trigger]domain.Status{}
	for _, tr := range domain.Transitions {
		if to, ok := targets[tr.On]; ok && to != tr.To {
			t.Errorf("%s leads to %s and to %s", tr.On, to, tr.To)
		}
		targets[tr.On] = tr.To
	}
	to, from, err := domain.Target(domain.TriggerCancel)
	if err != nil || to != domain.StatusCancelled || len(from) != 2 {
		t.Errorf("Target(cancel) = %s, %v, %v", to, from, err)
	}
	if _, _, err := domain.Target("nothing"); err == nil {
		t.Error("Target of an unknown trigger")
	}
	for _, s := range []domain.Status{domain.StatusFulfilled, domain.StatusRejected, domain.StatusCancelled} {
		if !s.Final() {
			t.Errorf("%s should be final", s)
		}
	}
}

func TestParseStatus(t *testing.T) {
	t.Parallel()
	for _, s := range domain.Statuses {
		if got, err := domain.ParseStatus(string(s)); err != nil || got != s {
			t.Errorf("ParseStatus(%s) = %s, %v", s, got, err)
		}
	}
	if _, err := domain.ParseStatus("submitted"); err == nil {
		t.Error("ParseStatus accepted a lower-case status")
	}
}
