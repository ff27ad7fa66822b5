package failover

import (
	"net/http"
	"time"
)

// Figures are what one failover cost, each duration from the event (the
// kill, or the switchover's request); a negative duration: not seen.
type Figures struct {
	Event
	// WritableIn: until the new leader took writes.
	WritableIn time.Duration
	// Next201: until the first 201 for an order the new leader created.
	Next201 time.Duration
	// NextPublish: until the relay first published a message of an outbox
	// row the new leader created.
	NextPublish time.Duration
	// NextApply: until the consumer first applied a message on the new
	// leader (an inbox row's processed_at).
	NextApply time.Duration
	// Refused and Unanswered count the creates answered 503, and those
	// without an answer, from the event to the next one.
	Refused, Unanswered int
	// Latest is the longest a message waited from its outbox row's
	// creation to its first publish, among the rows created from 5 s
	// before the event to the next event.
	Latest time.Duration
}

// Measure reads, for each of events (in order), what it cost, from the
// accounting of the run and the answers the load posted again.
func Measure(events []Event, r *Result, retries []Retry) []Figures {
	figs := make([]Figures, len(events))
	for i, ev := range events {
		end := time.Now().Add(24 * time.Hour)
		if i+1 < len(events) {
			end = events[i+1].At
		}
		f := Figures{Event: ev, WritableIn: ev.Writable.Sub(ev.At), Next201: -1, NextPublish: -1, NextApply: -1}
		after := func(ts time.Time) bool { return !ts.Before(ev.Writable) }
		first := func(d *time.Duration, ts time.Time) {
			if since := ts.Sub(ev.At); *d < 0 || since < *d {
				*d = since
			}
		}
		for _, o := range r.answered {
			if created, ok := r.orderCreated[o.ID]; ok && after(created) {
				first(&f.Next201, o.Answered)
			}
		}
		for id, published := range r.firstPublish {
			created, ok := r.rowCreated[id]
			if !ok {
				continue
			}
			if after(created) {
				first(&f.NextPublish, published)
			}
			if !created.Before(ev.At.Add(-5*time.Second)) && created.Before(end) {
				f.Latest = max(f.Latest, published.Sub(created))
			}
		}
		for _, ts := range r.processed {
			if after(ts) {
				first(&f.NextApply, ts)
				break // sorted
			}
		}
		for _, rt := range retries {
			if rt.At.Before(ev.At) || !rt.At.Before(end) {
				continue
			}
			switch rt.Status {
			case http.StatusServiceUnavailable:
				f.Refused++
			case 0:
				f.Unanswered++
			}
		}
		figs[i] = f
	}
	return figs
}
