package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/yourorg/orders/internal/consumer"
	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/domain"
	"github.com/yourorg/orders/internal/messaging/inbox"
	"github.com/yourorg/orders/internal/messaging/inbox/inboxadmin"
	"github.com/yourorg/orders/internal/messaging/outbox/outboxadmin"
	"github.com/yourorg/orders/internal/store"
	"github.com/yourorg/orders/internal/timeline"
)

// OrderTimeline is everything the system holds about one order.
type OrderTimeline struct {
	OrderID    uuid.UUID             `json:"order_id"`
	Status     string                `json:"status"`
	CustomerID string                `json:"customer_id"`
	CreatedAt  time.Time             `json:"created_at"`
	History    []Transition          `json:"history"`
	Outbox     []outboxadmin.Message `json:"outbox"`
	Inbox      []inboxadmin.Row      `json:"inbox"`
	Parked     []ParkedOf            `json:"parked"`
	ParkedNote string                `json:"parked_note,omitempty"` // why the parking lots could not be read
	TraceIDs   []string              `json:"trace_ids"`
	Events     []OrderEvent          `json:"events"` // all of the above in time order
}

// Transition is one row of the order's history.
type Transition struct {
	From          string    `json:"from_status"`
	To            string    `json:"to_status"`
	MessageID     string    `json:"message_id"` // empty: an HTTP request
	CorrelationID string    `json:"correlation_id"`
	Reason        string    `json:"reason,omitempty"` // why, when the move alone does not say (a rejection)
	At            time.Time `json:"created_at"`
}

// ParkedOf is a parked message of the order, and whose parking lot holds it.
type ParkedOf struct {
	Consumer string `json:"consumer"`
	inboxadmin.Parked
}

// OrderEvent is one line of the timeline.
type OrderEvent struct {
	At   time.Time `json:"at"`
	Who  string    `json:"who"`
	What string    `json:"what"`

	happened time.Time // where it sorts: At, or earlier when At is recorded late (events)
	rank     int       // among events that happened at once, the cause first
}

// The ranks of the events that happen at the same instant, in causal
// order: a message is published before it is received; a consumer's
// transaction receives it, moves the order, marks it processed and writes
// the next message, all at the transaction's now(); a request's moves the
// order and writes its message. A row's state that is not yet a publish
// (FAILED, PENDING) and a parking come after.
const (
	rankPublished = iota
	rankReceived
	rankOrderChanged
	rankProcessed
	rankWritten
	rankUnpublished
	rankParked
)

func orderTimeline(ctx context.Context, c *ctl) (report, error) {
	id, err := uuid.Parse(c.args.pos[0])
	if err != nil {
		return nil, fmt.Errorf("order id %q: %w", c.args.pos[0], err)
	}
	o, err := store.GetOrder(ctx, c.pool, id)
	if err != nil {
		return nil, err
	}
	t := &OrderTimeline{OrderID: id, Status: string(o.Status()), CustomerID: o.CustomerID(), CreatedAt: o.CreatedAt()}

	// The history, the outbox rows and the inbox rows.
	history, err := store.History(ctx, c.pool, id)
	if err != nil {
		return nil, err
	}
	for _, h := range history {
		t.History = append(t.History, Transition{From: string(h.From), To: string(h.To), MessageID: database.Deref(h.MessageID), CorrelationID: h.CorrelationID, Reason: h.Reason, At: h.CreatedAt})
	}
	since := timeline.MessagesSince(o.CreatedAt())
	if t.Outbox, err = outboxadmin.AggregateSince(ctx, c.pool, domain.AggregateOrder, id.String(), since); err != nil {
		return nil, err
	}
	if t.Inbox, err = inboxadmin.AggregateSince(ctx, c.pool, id.String(), since); err != nil {
		return nil, err
	}

	// The parking lots, looked at and left as they are. The broker being
	// away does not hide what the database knows.
	for _, name := range consumer.Names() {
		msgs, err := inboxadmin.Browse(ctx, c.cfg.AMQPURL, name, 0)
		var amqpErr *amqp.Error
		if errors.As(err, &amqpErr) && amqpErr.Code == amqp.NotFound {
			continue // the consumer never ran here: no parking lot
		}
		if err != nil {
			t.ParkedNote = "the parking lots could not be read: " + err.Error()
			break
		}
		for _, m := range msgs {
			if orderOf(m) == id.String() {
				t.Parked = append(t.Parked, ParkedOf{Consumer: name, Parked: m})
			}
		}
	}

	t.traces()
	t.events()
	return t, nil
}

// traces collects the trace ids: of the request (the outbox rows carry its
// traceparent) and of each processing (a replay starts a trace of its own).
func (t *OrderTimeline) traces() {
	t.TraceIDs = []string{}
	add := func(id string) {
		if id != "" && !slices.Contains(t.TraceIDs, id) {
			t.TraceIDs = append(t.TraceIDs, id)
		}
	}
	for _, x := range t.Outbox {
		add(x.TraceID)
	}
	for _, x := range t.Inbox {
		add(x.TraceID)
	}
}

// events merges the rows into one timeline, in the order things happened.
// That is time order, but for a published_at: the relay records it when
// the broker confirms, which may be after a consumer has received the
// message, so a publish sorts no later than the message's first receipt.
// Events at the same instant go in causal order (the ranks above).
func (t *OrderTimeline) events() {
	add := func(at time.Time, rank int, who, format string, args ...any) {
		t.Events = append(t.Events, OrderEvent{At: at, Who: who, What: fmt.Sprintf(format, args...), happened: at, rank: rank})
	}
	for _, h := range t.History {
		cause := "an HTTP request"
		if h.MessageID != "" {
			cause = "message " + h.MessageID
		}
		add(h.At, rankOrderChanged, "order", "%s -> %s (by %s)%s", cmp.Or(h.From, "(new)"), h.To, cause, strings.TrimSuffix(": "+h.Reason, ": "))
	}
	received := map[string]time.Time{} // a message's first receipt by any consumer
	for _, x := range t.Inbox {
		first := x.FirstReceivedAt
		if x.ProcessedAt != nil && x.ProcessedAt.Before(first) {
			first = *x.ProcessedAt
		}
		if r, ok := received[x.MessageID]; !ok || first.Before(r) {
			received[x.MessageID] = first
		}
	}
	for _, x := range t.Outbox {
		add(x.CreatedAt, rankWritten, "outbox", "%s written, message id %s", x.Type, x.ID)
		switch {
		case x.PublishedAt != nil:
			add(*x.PublishedAt, rankPublished, "relay", "%s published (attempt %d)", x.Type, x.Attempts)
			if r, ok := received[x.ID.String()]; ok && r.Before(*x.PublishedAt) {
				t.Events[len(t.Events)-1].happened = r
			}
		case x.Status == "FAILED":
			add(x.UpdatedAt, rankUnpublished, "relay", "%s FAILED after %d attempts: %s (orderctl outbox retry %s --reason ...)", x.Type, x.Attempts, x.LastError, x.ID)
		default:
			add(x.UpdatedAt, rankUnpublished, "relay", "%s %s, attempt %d %s", x.Type, x.Status, x.Attempts, x.LastError)
		}
	}
	for _, x := range t.Inbox {
		if x.Status == inbox.StatusProcessed && x.Attempts == 1 { // received and processed in one transaction
			add(*x.ProcessedAt, rankProcessed, x.Consumer, "%s processed: %s%s", x.Type, x.Outcome, strings.TrimSuffix(": "+x.OutcomeReason, ": "))
			continue
		}
		add(x.FirstReceivedAt, rankReceived, x.Consumer, "%s received", x.Type)
		if x.Status == inbox.StatusProcessed {
			add(*x.ProcessedAt, rankProcessed, x.Consumer, "%s processed: %s%s, attempt %d", x.Type, x.Outcome, strings.TrimSuffix(": "+x.OutcomeReason, ": "), x.Attempts)
		} else {
			add(x.LastReceivedAt, rankReceived, x.Consumer, "%s %s, attempt %d: %s %s", x.Type, x.Status, x.Attempts, x.LastErrorCode, x.LastErrorMessage)
		}
	}
	for _, p := range t.Parked {
		at, _ := time.Parse(time.RFC3339Nano, p.ParkedAt)
		add(at, rankParked, p.Consumer, "%s parked in %s: %s (orderctl parked show %s %s)", p.Type, inbox.ParkingLotName(inbox.QueueName(p.Consumer)), p.ReasonCode, p.Consumer, p.MessageID)
	}
	slices.SortStableFunc(t.Events, func(a, b OrderEvent) int {
		return cmp.Or(a.happened.Compare(b.happened), cmp.Compare(a.rank, b.rank))
	})
}

func (t *OrderTimeline) human(w io.Writer) {
	status := t.Status
	if n := len(t.History); n > 0 && t.History[n-1].To == t.Status && t.History[n-1].Reason != "" {
		status += ", " + t.History[n-1].Reason // why it is where it is: a rejection's skus
	}
	_, _ = fmt.Fprintf(w, "order %s: %s (customer %s, created %s)\n\n", t.OrderID, status, t.CustomerID, when(&t.CreatedAt))
	var rows [][]string
	for _, e := range t.Events {
		rows = append(rows, []string{when(&e.At), e.Who, e.What})
	}
	table(w, []string{"at (UTC)", "who", "what"}, rows)

	_, _ = fmt.Fprintln(w, "\noutbox rows:")
	rows = nil
	for _, x := range t.Outbox {
		rows = append(rows, []string{x.ID.String(), x.Type, x.Status, fmt.Sprint(x.Attempts), when(x.PublishedAt), orDash(x.LastError)})
	}
	table(w, []string{"  outbox_id", "message_type", "status", "attempts", "published_at", "last_error"}, indent(rows))

	_, _ = fmt.Fprintln(w, "\ninbox rows, per consumer:")
	rows = nil
	for _, x := range t.Inbox {
		rows = append(rows, []string{x.Consumer, x.Type, x.MessageID, x.Status, orDash(x.Outcome), fmt.Sprint(x.Attempts),
			orDash(strings.TrimSpace(x.OutcomeReason + " " + x.LastErrorCode + " " + x.LastErrorMessage)), when(x.ProcessedAt)})
	}
	slices.SortStableFunc(rows, func(a, b []string) int { return strings.Compare(a[0], b[0]) })
	table(w, []string{"  consumer", "message_type", "message_id", "status", "outcome", "attempts", "reason / error", "processed_at"}, indent(rows))

	switch {
	case t.ParkedNote != "":
		_, _ = fmt.Fprintf(w, "\nparked messages: unknown, %s\n", t.ParkedNote)
	case len(t.Parked) == 0:
		_, _ = fmt.Fprintln(w, "\nparked messages: none")
	default:
		_, _ = fmt.Fprintln(w, "\nparked messages (left in place):")
		rows = nil
		for _, p := range t.Parked {
			rows = append(rows, []string{p.Consumer, p.MessageID, p.Type, p.ReasonCode, p.Reason})
		}
		table(w, []string{"  consumer", "message_id", "type", "reason_code", "reason"}, indent(rows))
	}
	_, _ = fmt.Fprintf(w, "\ntrace id: %s\n", orDash(strings.Join(t.TraceIDs, ", ")))
}

// indent indents a table's rows by two spaces (the header says it too).
func indent(rows [][]string) [][]string {
	for _, r := range rows {
		r[0] = "  " + r[0]
	}
	return rows
}
