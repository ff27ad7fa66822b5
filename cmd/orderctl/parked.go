package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"

	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/domain"
	"github.com/yourorg/orders/internal/messaging/inbox"
	"github.com/yourorg/orders/internal/messaging/inbox/inboxadmin"
)

// The parking lots: look (inboxadmin.Browse leaves every message where it was),
// replay (inboxadmin.Replay), discard (inboxadmin.Discard).

type parkedListReport struct {
	Consumer string              `json:"consumer"`
	Queue    string              `json:"parking_lot"`
	Messages []inboxadmin.Parked `json:"messages"`
}

func parkedList(ctx context.Context, c *ctl) (report, error) {
	name := c.args.pos[0]
	msgs, err := inboxadmin.Browse(ctx, c.cfg.AMQPURL, name, c.args.limit)
	if err != nil {
		return nil, err
	}
	return parkedListReport{Consumer: name, Queue: inbox.ParkingLotName(inbox.QueueName(name)), Messages: msgs}, nil
}

func (r parkedListReport) human(w io.Writer) {
	if len(r.Messages) == 0 {
		_, _ = fmt.Fprintf(w, "%s is empty.\n", r.Queue)
		return
	}
	var rows [][]string
	for _, m := range r.Messages {
		rows = append(rows, []string{m.MessageID, m.Type, orDash(orderOf(m)), orDash(m.ReasonCode), fmt.Sprint(m.Attempts), orDash(m.ParkedAt), fmt.Sprint(m.ReplayCount)})
	}
	_, _ = fmt.Fprintf(w, "%s, oldest first (left in place):\n", r.Queue)
	table(w, []string{"message_id", "type", "order_id", "reason_code", "attempts", "parked_at", "replays"}, rows)
	_, _ = fmt.Fprintf(w, "\nnext: orderctl parked show %s <message_id>; after a fix, orderctl parked replay %s <message_id>|--all --reason \"...\"\n", r.Consumer, r.Consumer)
}

type parkedShowReport struct {
	Consumer string            `json:"consumer"`
	Message  inboxadmin.Parked `json:"message"`
	Body     json.RawMessage   `json:"body,omitempty"` // when it is JSON
	RawBody  string            `json:"raw_body,omitempty"`
	Inbox    *InboxRow         `json:"inbox_row,omitempty"`
}

func parkedShow(ctx context.Context, c *ctl) (report, error) {
	name, id := c.args.pos[0], c.args.pos[1]
	msgs, err := inboxadmin.Browse(ctx, c.cfg.AMQPURL, name, 0)
	if err != nil {
		return nil, err
	}
	i := slices.IndexFunc(msgs, func(p inboxadmin.Parked) bool { return p.MessageID == id })
	if i < 0 {
		return nil, fmt.Errorf("%w: no message %s in %s", domain.ErrNotFound, id, inbox.ParkingLotName(inbox.QueueName(name)))
	}
	r := parkedShowReport{Consumer: name, Message: msgs[i]}
	if json.Valid(r.Message.Body) {
		r.Body = r.Message.Body
	} else {
		r.RawBody = string(r.Message.Body)
	}
	row, err := inboxadmin.Get(ctx, c.pool, name, id)
	switch {
	case err == nil:
		r.Inbox = (*InboxRow)(&row)
	case !errors.Is(err, database.ErrNotFound): // parked by the broker at its delivery limit: no row
		return nil, err
	}
	return r, nil
}

func (r parkedShowReport) human(w io.Writer) {
	m := r.Message
	_, _ = fmt.Fprintf(w, "message %s (%s), parked by %s, left in place\n", m.MessageID, m.Type, r.Consumer)
	_, _ = fmt.Fprintf(w, "  reason:   %s: %s\n  attempts: %d, parked at %s, replayed %d time(s) before\n",
		orDash(m.ReasonCode), orDash(m.Reason), m.Attempts, orDash(m.ParkedAt), m.ReplayCount)
	_, _ = fmt.Fprintln(w, "headers:")
	for _, k := range slices.Sorted(maps.Keys(m.Headers)) {
		_, _ = fmt.Fprintf(w, "  %s: %v\n", k, m.Headers[k])
	}
	_, _ = fmt.Fprintln(w, "body:")
	var pretty bytes.Buffer
	if r.Body != nil && json.Indent(&pretty, r.Body, "  ", "  ") == nil {
		_, _ = fmt.Fprintf(w, "  %s\n", pretty.String())
	} else {
		_, _ = fmt.Fprintf(w, "  %q\n", r.RawBody)
	}
	if r.Inbox != nil {
		_, _ = fmt.Fprintln(w, "inbox row:")
		r.Inbox.human(w)
	} else {
		_, _ = fmt.Fprintln(w, "no inbox row: the broker parked it at the work queue's delivery limit, or its envelope was unreadable")
	}
	_, _ = fmt.Fprintf(w, "\nnext: after a fix, orderctl parked replay %s %s --reason \"...\"; if the message itself is wrong, orderctl parked discard %s %s --reason \"...\" once the incident is closed\n",
		r.Consumer, m.MessageID, r.Consumer, m.MessageID)
}

type replayReport struct {
	Consumer string   `json:"consumer"`
	Moved    []string `json:"moved"`
	Audit    *Audit   `json:"audit,omitempty"`
}

// parkedReplay moves parked messages back to the work queue. The broker and
// the database share no transaction, so the audit row is written after the
// move, with what was moved: a replayed message is not lost anyway (it is
// in the work queue, and its inbox row shows it come back).
func parkedReplay(ctx context.Context, c *ctl) (report, error) {
	name := c.args.pos[0]
	req := inboxadmin.ReplayRequest{Window: c.cfg.ReplayWindow, DB: c.pool, PastWindow: c.args.pastWindow}
	switch {
	case len(c.args.pos) == 2 && !c.args.all:
		req.MessageID = c.args.pos[1]
	case len(c.args.pos) == 1 && c.args.all:
		req.Limit = c.args.limit
	default:
		return nil, errors.New("want a consumer and either a message id or --all")
	}
	moved, replayErr := inboxadmin.Replay(ctx, c.cfg.AMQPURL, name, req)
	r := replayReport{Consumer: name, Moved: moved}
	if len(moved) > 0 {
		target := name
		if req.MessageID != "" {
			target += " " + req.MessageID
		}
		details := map[string]any{"moved": moved}
		if replayErr != nil {
			details["error"] = replayErr.Error()
		}
		a, err := c.record(ctx, c.pool, "parked.replay", target, c.args.reason, details)
		if err != nil {
			return nil, errors.Join(replayErr, fmt.Errorf("replayed %v, but %w", moved, err))
		}
		r.Audit = &a
	}
	if past := (*inboxadmin.PastWindowError)(nil); errors.As(replayErr, &past) {
		return nil, fmt.Errorf("replayed %d; %w", len(moved), replayErr)
	}
	if replayErr != nil {
		return nil, fmt.Errorf("replayed %d before: %w", len(moved), replayErr)
	}
	if req.MessageID != "" && len(moved) == 0 {
		return nil, fmt.Errorf("%w: no message %s in %s", domain.ErrNotFound, req.MessageID, inbox.ParkingLotName(inbox.QueueName(name)))
	}
	return r, nil
}

func (r replayReport) human(w io.Writer) {
	if len(r.Moved) == 0 {
		_, _ = fmt.Fprintln(w, "Nothing to replay: the parking lot is empty.")
		return
	}
	for _, id := range r.Moved {
		_, _ = fmt.Fprintf(w, "%s -> %s\n", id, inbox.QueueName(r.Consumer))
	}
	_, _ = fmt.Fprintf(w, "%d message(s) replayed, same message ids. Audit #%d. Follow each with: orderctl inbox show %s <message_id>\n",
		len(r.Moved), r.Audit.ID, r.Consumer)
}

type discardReport struct {
	Consumer  string            `json:"consumer"`
	Message   inboxadmin.Parked `json:"discarded"`
	Audit     Audit             `json:"audit"`
	Forgotten bool              `json:"inbox_row_removed"` // its failed inbox row was removed
}

// parkedDiscard removes one parked message for good. The audit row is
// written first, and the message acknowledged away only once it committed:
// a discarded message is gone, so its discard must never go unrecorded.
// The row keeps its headers and the hash of its body, not the body (it may
// hold personal data, which the inbox does not keep either).
func parkedDiscard(ctx context.Context, c *ctl) (report, error) {
	name := c.args.pos[0]
	r := discardReport{Consumer: name}
	var err error
	r.Message, err = inboxadmin.Discard(ctx, c.cfg.AMQPURL, name, c.args.pos[1], func(p inboxadmin.Parked) error {
		r.Audit, err = c.record(ctx, c.pool, "parked.discard", name+" "+p.MessageID, c.args.reason, p)
		return err
	})
	if err != nil {
		return nil, err
	}
	// Gone for good: its failed inbox row goes too, so that the later
	// messages of its order parked behind it (held_behind, with
	// MESSAGE_PARTITIONS) may be replayed. The audit keeps what it was.
	if r.Forgotten, err = inboxadmin.ForgetFailure(ctx, c.pool, name, r.Message.MessageID); err != nil {
		return nil, err
	}
	return r, nil
}

func (r discardReport) human(w io.Writer) {
	_, _ = fmt.Fprintf(w, "%s (%s, %s) discarded from %s. Audit #%d keeps its headers.\n",
		r.Message.MessageID, r.Message.Type, orDash(r.Message.ReasonCode), inbox.ParkingLotName(inbox.QueueName(r.Consumer)), r.Audit.ID)
	if r.Forgotten {
		_, _ = fmt.Fprintf(w, "Its failed inbox row is removed: later messages of its order parked behind it may be replayed.\n")
	}
}

// orderOf is the order a parked message is about: the aggregate the
// consumer named when it parked it, or the order_id of its body (a message
// the broker parked at its delivery limit names none).
func orderOf(m inboxadmin.Parked) string {
	if m.AggregateID != "" {
		return m.AggregateID
	}
	var payload struct {
		OrderID string `json:"order_id"`
	}
	_ = json.Unmarshal(m.Body, &payload) // a malformed body has no order: it is parked for that
	return payload.OrderID
}
