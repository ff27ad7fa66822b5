package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/yourorg/orders/internal/consumer"
	"github.com/yourorg/orders/internal/messaging"
	"github.com/yourorg/orders/internal/messaging/inbox"
	"github.com/yourorg/orders/internal/messaging/inbox/inboxadmin"
	"github.com/yourorg/orders/internal/messaging/outbox/outboxadmin"
	"github.com/yourorg/orders/internal/messaging/tablestats"
)

// horizonHeldAfter is when a transaction horizon held back counts as a
// problem, as the alert on it (deploy/prometheus/alerts.yml).
const horizonHeldAfter = 5 * time.Minute

// stuckAfter is when an unpublished outbox row counts as stuck: a running
// relay publishes a committed row within milliseconds.
const stuckAfter = time.Minute

// StatusReport is the state of the whole system, with what to do next.
type StatusReport struct {
	Outbox []Backlog `json:"outbox"` // PENDING, PUBLISHING and FAILED rows by type
	Inbox  []Backlog `json:"inbox"`  // rows not PROCESSED, by consumer
	// OutboxPartitions and InboxPartitions are message_outbox's and
	// message_inbox's time partitions.
	OutboxPartitions TimePartitions `json:"outbox_time_partitions"`
	InboxPartitions  TimePartitions `json:"inbox_time_partitions"`
	Queues           []QueueDepth   `json:"queues"`
	QueueNote        string         `json:"queue_note,omitempty"` // why the depths are missing
	Stuck            []Stuck        `json:"stuck"`                // the oldest stuck items
	Tables           []TableStats   `json:"tables"`               // the outbox's and the inbox's tables
	Horizon          []Holder       `json:"horizon"`              // what holds the transaction horizon, oldest first
	Next             []string       `json:"next"`                 // what to do, most urgent first
}

// Backlog counts rows of one status.
type Backlog struct {
	Status        string        `json:"status"`
	Of            string        `json:"of"` // the message type (outbox) or the consumer (inbox)
	Rows          int64         `json:"rows"`
	Oldest        time.Duration `json:"-"`
	OldestSeconds float64       `json:"oldest_age_seconds,omitempty"`
}

// TimePartitions says how far ahead a table's time partitions reach,
// and which ones past RELAY_RETENTION retention waits for.
type TimePartitions struct {
	Count   int                         `json:"count"`
	Ends    time.Time                   `json:"ends"` // the last one's end: a row written after it is refused
	Waiting []outboxadmin.TimePartition `json:"waiting"`
}

// QueueDepth is what a passive declare says of one queue.
type QueueDepth struct {
	Consumer  string `json:"consumer"`
	Queue     string `json:"queue"`
	Kind      string `json:"kind"` // work, retry or parking lot
	Messages  int    `json:"messages"`
	Consumers int    `json:"consumers"`
	Missing   bool   `json:"missing,omitempty"` // not declared: the consumer never ran against this broker
}

// TableStats is what PostgreSQL's statistics say of a table, summed over
// its partitions (tablestats.Table).
type TableStats struct {
	Table              string  `json:"table"`
	Partitions         int     `json:"partitions"`
	LiveTuples         int64   `json:"live_tuples"`
	DeadTuples         int64   `json:"dead_tuples"`
	TableBytes         int64   `json:"table_bytes"`
	IndexBytes         int64   `json:"index_bytes"`
	SinceVacuumSeconds float64 `json:"since_vacuum_seconds,omitempty"` // absent: never vacuumed
}

// Holder is one thing holding the transaction horizon back
// (tablestats.Holder).
type Holder struct {
	Kind       string  `json:"kind"`  // session, slot or prepared
	Name       string  `json:"name"`  // application_name, slot name or gid
	State      string  `json:"state"` // "idle in transaction", ...
	PID        int32   `json:"pid,omitempty"`
	XIDAge     int64   `json:"xid_age"` // transactions since its oldest xid
	AgeSeconds float64 `json:"age_seconds,omitempty"`
}

// Stuck is one item that needs a look.
type Stuck struct {
	Where      string        `json:"where"` // outbox, or inbox/<consumer>
	ID         string        `json:"id"`
	What       string        `json:"what"`
	Age        time.Duration `json:"-"`
	AgeSeconds float64       `json:"age_seconds"`
	Next       string        `json:"next"`
}

func status(ctx context.Context, c *ctl) (report, error) {
	r := &StatusReport{Stuck: []Stuck{}, Next: []string{}}
	next := func(s string) {
		if !slices.Contains(r.Next, s) {
			r.Next = append(r.Next, s)
		}
	}

	// The outbox and the inbox, by the same queries as the services' gauges.
	ostats, err := outboxadmin.Stats(ctx, c.pool)
	if err != nil {
		return nil, err
	}
	for _, s := range ostats {
		r.Outbox = append(r.Outbox, Backlog{Status: s.Status, Of: s.MessageType, Rows: s.Rows, Oldest: s.OldestAge, OldestSeconds: s.OldestAge.Seconds()})
		if s.Status == "FAILED" {
			next(fmt.Sprintf("orderctl outbox failed --type %s   (then, once the cause is fixed: orderctl outbox retry --type %s --reason \"...\")", s.MessageType, s.MessageType))
		}
	}
	parts, err := outboxadmin.TimePartitions(ctx, c.pool, c.cfg.OutboxRetention)
	if err != nil {
		return nil, err
	}
	r.OutboxPartitions = TimePartitions{Count: len(parts), Waiting: []outboxadmin.TimePartition{}}
	for _, p := range parts {
		r.OutboxPartitions.Ends = p.Ends // oldest first
		if p.PastRetention {
			r.OutboxPartitions.Waiting = append(r.OutboxPartitions.Waiting, p)
		}
	}
	if time.Until(r.OutboxPartitions.Ends) < 7*24*time.Hour {
		next(fmt.Sprintf("the outbox's time partitions end %s, and a message written after that is refused: is an outbox-relay running?",
			r.OutboxPartitions.Ends.UTC().Format(time.RFC3339)))
	}
	if len(r.OutboxPartitions.Waiting) > 0 {
		next("outbox time partitions past RELAY_RETENTION wait for their rows (not PUBLISHED, or published recently): orderctl outbox failed")
	}
	iparts, err := inboxadmin.TimePartitions(ctx, c.pool, c.cfg.InboxRetention)
	if err != nil {
		return nil, err
	}
	r.InboxPartitions = TimePartitions{Count: len(iparts), Waiting: []outboxadmin.TimePartition{}}
	for _, p := range iparts {
		r.InboxPartitions.Ends = p.Ends // oldest first
		if p.PastRetention {
			r.InboxPartitions.Waiting = append(r.InboxPartitions.Waiting, outboxadmin.TimePartition(p))
		}
	}
	if time.Until(r.InboxPartitions.Ends) < 7*24*time.Hour {
		next(fmt.Sprintf("the inbox's time partitions end %s, and a delivery after that fails: is an order-consumer running?",
			r.InboxPartitions.Ends.UTC().Format(time.RFC3339)))
	}
	if len(r.InboxPartitions.Waiting) > 0 {
		next("inbox time partitions past CONSUMER_INBOX_RETENTION wait for their rows (not PROCESSED, or processed recently): orderctl parked list <consumer>")
	}
	istats, err := inboxadmin.Stats(ctx, c.pool)
	if err != nil {
		return nil, err
	}
	for _, s := range istats {
		r.Inbox = append(r.Inbox, Backlog{Status: s.Status, Of: s.Consumer, Rows: s.Rows, Oldest: s.OldestAge, OldestSeconds: s.OldestAge.Seconds()})
	}

	// The tables' bloat and the horizon, by the same reads as the gauges.
	if err := r.tables(ctx, c); err != nil {
		return nil, err
	}
	for _, h := range r.Horizon {
		if time.Duration(h.AgeSeconds*float64(time.Second)) > horizonHeldAfter {
			next(fmt.Sprintf("%s %s (pid %d, %s) has held the transaction horizon for %s: vacuum cannot clean up behind it; end it (docs/operations.md#a-held-transaction-horizon)",
				h.Kind, h.Name, h.PID, h.State, age(time.Duration(h.AgeSeconds*float64(time.Second)))))
		}
	}

	// The oldest stuck items.
	if err := r.stuck(ctx, c); err != nil {
		return nil, err
	}
	for i, s := range r.Stuck {
		r.Stuck[i].AgeSeconds = s.Age.Seconds()
		next(s.Next)
	}

	// The queues, by passive declares: they change nothing.
	if err := r.queues(ctx, c); err != nil {
		r.QueueNote = "the queue depths could not be read: " + err.Error()
	}
	for _, q := range r.Queues {
		switch {
		case q.Kind == "parking lot" && q.Messages > 0:
			next("orderctl parked list " + q.Consumer)
		case q.Kind == "work" && q.Messages > 0 && q.Consumers == 0:
			next(fmt.Sprintf("%s has %d messages and no consumer: is order-consumer running (CONSUMERS)?", q.Queue, q.Messages))
		}
	}
	return r, nil
}

func (r *StatusReport) tables(ctx context.Context, c *ctl) error {
	r.Tables, r.Horizon = []TableStats{}, []Holder{}
	for _, read := range []func(context.Context, tablestats.DB) (tablestats.Table, error){outboxadmin.Table, inboxadmin.Table} {
		t, err := read(ctx, c.pool)
		if err != nil {
			return err
		}
		s := TableStats{Table: t.Name, Partitions: t.Partitions, LiveTuples: t.LiveTuples, DeadTuples: t.DeadTuples,
			TableBytes: t.TableBytes, IndexBytes: t.IndexBytes}
		if t.Vacuumed {
			s.SinceVacuumSeconds = max(t.SinceVacuum.Seconds(), 0.001)
		}
		r.Tables = append(r.Tables, s)
	}
	holders, err := tablestats.Horizon(ctx, c.pool)
	if err != nil {
		return err
	}
	for _, h := range holders {
		r.Horizon = append(r.Horizon, Holder{Kind: string(h.Kind), Name: h.Name, State: h.State, PID: h.PID, XIDAge: h.XIDAge, AgeSeconds: h.Age.Seconds()})
	}
	return nil
}

func (r *StatusReport) stuck(ctx context.Context, c *ctl) error {
	messages, err := outboxadmin.Stuck(ctx, c.pool, stuckAfter, 5)
	if err != nil {
		return err
	}
	for _, m := range messages {
		s := Stuck{Where: "outbox", ID: m.ID.String(), Age: time.Since(m.CreatedAt),
			What: fmt.Sprintf("%s of order %s: %s after %d attempts %s", m.Type, m.AggregateID, m.Status, m.Attempts, m.LastError)}
		switch {
		case m.Status == "FAILED":
			s.Next = fmt.Sprintf("fix what last_error says, then: orderctl outbox retry %s --reason \"...\"", s.ID)
		case m.Status == "PUBLISHING":
			s.Next = "a relay holds it; any relay takes it back when the lease (RELAY_LEASE) ends"
		case m.LastError != "":
			s.Next = "the relay retries it with backoff; an unroutable one needs the consumer that binds " + m.Type
		default:
			s.Next = "never tried: is an outbox-relay running against this database?"
		}
		r.Stuck = append(r.Stuck, s)
	}

	rows, err := inboxadmin.Unprocessed(ctx, c.pool, 10)
	if err != nil {
		return err
	}
	for _, x := range rows {
		s := Stuck{Where: "inbox/" + x.Consumer, ID: x.MessageID, Age: time.Since(x.FirstReceivedAt),
			What: fmt.Sprintf("%s of order %s: %s after %d attempts %s", x.Type, orDash(x.AggregateID), x.Status, x.Attempts, x.LastErrorCode)}
		switch x.Status {
		case inbox.StatusPermanentFailed, inbox.StatusPoisoned:
			s.Next = "orderctl parked list " + x.Consumer
		default:
			s.Next = "orderctl inbox show " + x.Consumer + " " + x.MessageID
		}
		r.Stuck = append(r.Stuck, s)
	}
	return nil
}

// queues reads the depth of every consumer's queues, as order-consumer
// declares them with the same MESSAGE_PARTITIONS and CONSUMER_RETRY_DELAYS:
// a work queue per partition (a consumer retries in place there), else
// one work queue and its retry queues. A passive declare of a queue that
// does not exist closes its channel, so each has its own.
func (r *StatusReport) queues(ctx context.Context, c *ctl) error {
	conn, err := messaging.Dial(ctx, c.cfg.AMQPURL, "orderctl status")
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	for _, name := range consumer.Names() {
		t := inbox.Topology{Consumer: name, Partitions: c.cfg.MessagePartitions}
		var all []QueueDepth
		for _, q := range t.WorkQueues() {
			all = append(all, QueueDepth{Consumer: name, Queue: q, Kind: "work"})
		}
		if t.Partitions == 0 {
			for _, d := range c.cfg.RetryDelays {
				all = append(all, QueueDepth{Consumer: name, Queue: t.RetryQueue(d), Kind: "retry"})
			}
		}
		all = append(all, QueueDepth{Consumer: name, Queue: inbox.ParkingLotName(t.Queue()), Kind: "parking lot"})
		for _, q := range all {
			ch, err := conn.Channel()
			if err != nil {
				return fmt.Errorf("open channel: %w", err)
			}
			info, err := ch.QueueDeclarePassive(q.Queue, true, false, false, false, nil)
			var amqpErr *amqp.Error
			switch {
			case errors.As(err, &amqpErr) && amqpErr.Code == amqp.NotFound:
				q.Missing = true
			case err != nil:
				return fmt.Errorf("declare %s (passive): %w", q.Queue, err)
			default:
				q.Messages, q.Consumers = info.Messages, info.Consumers
				_ = ch.Close()
			}
			r.Queues = append(r.Queues, q)
		}
	}
	return nil
}

func (r *StatusReport) human(w io.Writer) {
	_, _ = fmt.Fprintln(w, "outbox (rows not yet published):")
	var rows [][]string
	for _, b := range r.Outbox {
		rows = append(rows, []string{"  " + b.Status, b.Of, fmt.Sprint(b.Rows), oldest(b)})
	}
	if len(rows) == 0 {
		_, _ = fmt.Fprintln(w, "  none: every row is published")
	} else {
		table(w, []string{"  status", "message_type", "rows", "oldest"}, rows)
	}

	for _, tp := range []struct {
		what, setting, final string
		TimePartitions
	}{{"outbox", "RELAY_RETENTION", "PUBLISHED", r.OutboxPartitions}, {"inbox", "CONSUMER_INBOX_RETENTION", "PROCESSED", r.InboxPartitions}} {
		_, _ = fmt.Fprintf(w, "\n%s time partitions: %d, the last ends %s\n", tp.what, tp.Count, tp.Ends.UTC().Format(time.RFC3339))
		for _, p := range tp.Waiting {
			_, _ = fmt.Fprintf(w, "  %s ended %s, past %s: retention waits for %d rows not %s or %s within it\n",
				p.Name, p.Ends.UTC().Format(time.RFC3339), tp.setting, p.HeldRows, tp.final, strings.ToLower(tp.final))
		}
	}

	_, _ = fmt.Fprintln(w, "\ninbox (rows not PROCESSED):")
	rows = nil
	for _, b := range r.Inbox {
		rows = append(rows, []string{"  " + b.Of, b.Status, fmt.Sprint(b.Rows), oldest(b)})
	}
	if len(rows) == 0 {
		_, _ = fmt.Fprintln(w, "  none")
	} else {
		table(w, []string{"  consumer", "status", "rows", "oldest"}, rows)
	}

	_, _ = fmt.Fprintln(w, "\ntables (PostgreSQL's statistics, summed over partitions):")
	rows = nil
	for _, t := range r.Tables {
		vacuumed := "never"
		if t.SinceVacuumSeconds > 0 {
			vacuumed = age(time.Duration(t.SinceVacuumSeconds*float64(time.Second))) + " ago"
		}
		rows = append(rows, []string{"  " + t.Table, fmt.Sprint(t.LiveTuples), fmt.Sprint(t.DeadTuples), size(t.TableBytes), size(t.IndexBytes), vacuumed})
	}
	table(w, []string{"  table", "live", "dead", "size", "indexes", "vacuumed"}, rows)

	_, _ = fmt.Fprintln(w, "\ntransaction horizon (vacuum keeps every row version these may still see), oldest first:")
	if len(r.Horizon) == 0 {
		_, _ = fmt.Fprintln(w, "  nothing holds it")
	}
	for i, h := range r.Horizon {
		if i == 3 {
			_, _ = fmt.Fprintf(w, "  and %d more\n", len(r.Horizon)-i)
			break
		}
		held := "since unknown"
		if h.AgeSeconds > 0 {
			held = "for " + age(time.Duration(h.AgeSeconds*float64(time.Second)))
		}
		_, _ = fmt.Fprintf(w, "  %s %s (pid %d, %s): held %s, %d transactions ago\n", h.Kind, orDash(h.Name), h.PID, orDash(h.State), held, h.XIDAge)
	}

	_, _ = fmt.Fprintln(w, "\nqueues:")
	if r.QueueNote != "" {
		_, _ = fmt.Fprintf(w, "  %s\n", r.QueueNote)
	}
	rows = nil
	for _, q := range r.Queues {
		depth, consumers := fmt.Sprint(q.Messages), fmt.Sprint(q.Consumers)
		if q.Missing {
			depth, consumers = "absent", "-"
		}
		rows = append(rows, []string{"  " + q.Queue, q.Kind, depth, consumers})
	}
	if len(rows) > 0 {
		table(w, []string{"  queue", "kind", "messages", "consumers"}, rows)
	}

	_, _ = fmt.Fprintf(w, "\nstuck (outbox rows FAILED, or unpublished for over %s; inbox rows not PROCESSED), oldest first:\n", stuckAfter)
	if len(r.Stuck) == 0 {
		_, _ = fmt.Fprintln(w, "  nothing")
	}
	for _, s := range r.Stuck {
		_, _ = fmt.Fprintf(w, "  %s %s (%s old): %s\n    next: %s\n", s.Where, s.ID, age(s.Age), s.What, s.Next)
	}

	_, _ = fmt.Fprintln(w, "\nnext:")
	if len(r.Next) == 0 {
		_, _ = fmt.Fprintln(w, "  nothing to do")
	}
	for _, n := range r.Next {
		_, _ = fmt.Fprintf(w, "  %s\n", n)
	}
}

// size prints a size in binary units, as pg_size_pretty does.
func size(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	v, i := float64(n)/unit, 0
	for v >= unit && i < 3 {
		v /= unit
		i++
	}
	return fmt.Sprintf("%.1f %s", v, []string{"KiB", "MiB", "GiB", "TiB"}[i])
}

func oldest(b Backlog) string {
	if b.Oldest == 0 {
		return "-"
	}
	return age(b.Oldest)
}
