package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/yourorg/orders/internal/consumer"
	"github.com/yourorg/orders/internal/domain"
	"github.com/yourorg/orders/internal/messaging/inbox"
	"github.com/yourorg/orders/internal/messaging/inbox/inboxadmin"
	"github.com/yourorg/orders/internal/messaging/outbox/outboxadmin"
)

// report is what the invariant checker found.
type report struct {
	orders, final, stuck int
	byStatus             map[string]int // orders by status
	wrong                []string       // orders final in another status than their story (out of stock, cancelled) calls for

	lost    map[string]int            // per consumer: published messages of a type it binds, neither received (no inbox row) nor parked
	parked  map[string]map[string]int // per consumer: parked messages by reason (inboxadmin.ParkedReason)
	outbox  map[string]int            // outbox rows by status
	unready map[string]int            // inbox rows not PROCESSED, by status

	twice       map[string]int // effects applied twice, by what
	sentUnheard int            // notifications SENT that the webhook never received
	hookCalls   int            // webhook calls recorded
	hookReplays int            // of which retries of a key seen before (the receiver deduplicates them)
	redelivered int            // inbox rows that saw more than one delivery (duplicates absorbed)
}

// lostTotal is the messages lost, and the notifications marked SENT that
// never arrived.
func (r *report) lostTotal() int { return sum(r.lost) + r.sentUnheard }

func (r *report) doubled() int { return sum(r.twice) }

func (r *report) ok() bool {
	return r.lostTotal() == 0 && r.doubled() == 0 && r.stuck == 0 && len(r.wrong) == 0
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// check reads the run's database, its parking lots and the webhook's
// record, and reports.
func check(ctx context.Context, s *system, ld *load) (*report, error) {
	r := &report{byStatus: map[string]int{}, lost: map[string]int{}, parked: map[string]map[string]int{},
		outbox: map[string]int{}, unready: map[string]int{}, twice: map[string]int{"inbox rows (consumer, message id)": 0}}
	conn, err := pgx.Connect(ctx, s.dbURL)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	// Orders: every order in the database, whether or not its POST was
	// answered.
	if err := groupCount(ctx, conn, r.byStatus, "SELECT status, count(*) FROM orders GROUP BY status"); err != nil {
		return nil, err
	}
	for status, n := range r.byStatus {
		r.orders += n
		if status == "FULFILLED" || status == "REJECTED" || status == "CANCELLED" {
			r.final += n
		} else {
			r.stuck += n
		}
	}
	statuses := map[string]string{}
	rows, err := conn.Query(ctx, "SELECT order_id::text, status FROM orders")
	if err != nil {
		return nil, err
	}
	var id, status string
	if _, err := pgx.ForEachRow(rows, []any{&id, &status}, func() error { statuses[id] = status; return nil }); err != nil {
		return nil, err
	}
	for _, o := range ld.orders {
		want := "FULFILLED"
		switch {
		case o.cancelled:
			want = "CANCELLED"
		case o.cancel:
			continue // refused (the order was final) or unanswered: either way
		case o.oos:
			want = "REJECTED"
		}
		if got := statuses[o.id]; isFinal(got) && got != want {
			r.wrong = append(r.wrong, fmt.Sprintf("%s is %s, want %s", o.id, got, want))
		}
	}

	// Messages, order by order through the outbox's and the inbox's read
	// APIs: each published message must have reached every consumer that
	// binds its type: an inbox row, or a place in the parking lot.
	var published []outboxadmin.Message
	received := map[string]bool{} // consumer + " " + message id
	followUps := map[string]int{} // order + " " + message type
	for id := range statuses {
		messages, err := outboxadmin.Aggregate(ctx, conn, domain.AggregateOrder, id)
		if err != nil {
			return nil, err
		}
		for _, m := range messages {
			r.outbox[m.Status]++
			followUps[id+" "+m.Type]++
			if m.Status == "PUBLISHED" {
				published = append(published, m)
			}
		}
		rows, err := inboxadmin.Aggregate(ctx, conn, id)
		if err != nil {
			return nil, err
		}
		for _, x := range rows {
			if received[x.Consumer+" "+x.MessageID] {
				r.twice["inbox rows (consumer, message id)"]++
			}
			received[x.Consumer+" "+x.MessageID] = true
			if x.LastReceivedAt.After(x.FirstReceivedAt.Add(time.Millisecond)) {
				r.redelivered++
			}
		}
	}
	stats, err := inboxadmin.Stats(ctx, conn)
	if err != nil {
		return nil, err
	}
	for _, s := range stats {
		r.unready[s.Status] += int(s.Rows)
	}
	amqpConn, err := amqp.Dial(s.amqpURL)
	if err != nil {
		return nil, err
	}
	defer amqpConn.Close()
	ch, err := amqpConn.Channel()
	if err != nil {
		return nil, err
	}
	for _, c := range consumer.All(consumer.Deps{}) {
		name := c.Name()
		parkedIDs, reasons, err := drainParkingLot(ch, inbox.ParkingLotName(inbox.QueueName(name)))
		if err != nil {
			return nil, err
		}
		r.parked[name] = reasons
		for _, m := range published {
			id := m.ID.String()
			if slices.Contains(c.Types(), m.Type) && !received[name+" "+id] && !parkedIDs[id] {
				r.lost[name]++
			}
		}
	}

	// Effects applied twice. The inbox's key (consumer, message id) makes a
	// second row for one message impossible; these count what a second
	// application would leave behind all the same.
	twice := map[string]string{
		"order transitions (order, to status)": "SELECT count(*) FROM (SELECT 1 FROM order_state_transition GROUP BY order_id, to_status HAVING count(*) > 1) t",
		"stock reservations per order":         "SELECT count(*) FROM (SELECT 1 FROM stock_reservation GROUP BY order_id HAVING count(*) > 1) t",
		"shipments per order":                  "SELECT count(*) FROM (SELECT 1 FROM shipment GROUP BY order_id HAVING count(*) > 1) t",
		"notifications (order, kind)":          "SELECT count(*) FROM (SELECT 1 FROM customer_notification GROUP BY order_id, kind HAVING count(*) > 1) t",
	}
	for what, query := range twice {
		var n int
		if err := conn.QueryRow(ctx, query).Scan(&n); err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		r.twice[what] = n
	}
	r.twice["follow-up messages (order, message type)"] = 0
	for _, n := range followUps {
		if n > 1 {
			r.twice["follow-up messages (order, message type)"]++
		}
	}

	// The webhook's side: each notification arrived under one key, and each
	// one SENT arrived.
	rows, err = conn.Query(ctx, "SELECT notification_id::text FROM customer_notification WHERE status = 'SENT'")
	if err != nil {
		return nil, err
	}
	sent, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	s.hook.mu.Lock()
	defer s.hook.mu.Unlock()
	r.hookCalls = s.hook.calls
	r.hookReplays = s.hook.calls - len(s.hook.keys)
	r.twice["webhook: an (order, kind) under two keys"] = 0
	for _, keys := range s.hook.notes {
		if len(keys) > 1 {
			r.twice["webhook: an (order, kind) under two keys"]++
		}
	}
	for _, id := range sent {
		if s.hook.keys[id] == 0 {
			r.sentUnheard++
		}
	}
	return r, nil
}

func isFinal(status string) bool {
	return status == "FULFILLED" || status == "REJECTED" || status == "CANCELLED"
}

// groupCount adds up the rows of query (a key and a count) into m.
func groupCount(ctx context.Context, conn *pgx.Conn, m map[string]int, query string) error {
	rows, err := conn.Query(ctx, query)
	if err != nil {
		return err
	}
	var key string
	var n int
	_, err = pgx.ForEachRow(rows, []any{&key, &n}, func() error { m[key] += n; return nil })
	return err
}

// drainParkingLot takes every message out of a parking lot (the vhost is
// deleted next) and returns their ids and their count by reason.
func drainParkingLot(ch *amqp.Channel, queue string) (map[string]bool, map[string]int, error) {
	ids, reasons := map[string]bool{}, map[string]int{}
	for {
		d, ok, err := ch.Get(queue, true)
		if err != nil {
			return nil, nil, fmt.Errorf("read %s: %w", queue, err)
		}
		if !ok {
			return ids, reasons, nil
		}
		ids[d.MessageId] = true
		code, _ := inboxadmin.ParkedReason(d.Headers)
		reasons[code]++
	}
}

// print writes the report.
func (r *report) print(w io.Writer, cfg config, faults map[string]int, ld *load) {
	var b strings.Builder
	fmt.Fprintf(&b, "\nsoak: %s at %g orders/s, seed %d\n", cfg.duration, cfg.rate, cfg.seed)
	fmt.Fprintf(&b, "faults:                %s\n", tally(faults))
	fmt.Fprintf(&b, "orders created:        %d (%s); POSTs refused: %d (%s)\n", r.orders, tally(r.byStatus), ld.refusedTotal(), tally(ld.refused))
	fmt.Fprintf(&b, "orders final:          %d\n", r.final)
	fmt.Fprintf(&b, "orders stuck:          %d\n", r.stuck)
	fmt.Fprintf(&b, "orders final wrongly:  %d %s\n", len(r.wrong), strings.Join(first(r.wrong, 5), "; "))
	fmt.Fprintf(&b, "messages lost:         %d (%s); notifications SENT never received: %d\n", sum(r.lost), tally(r.lost), r.sentUnheard)
	var twice []string
	for what, n := range r.twice {
		twice = append(twice, fmt.Sprintf("%s %d", what, n))
	}
	slices.Sort(twice)
	fmt.Fprintf(&b, "effects applied twice: %d (%s)\n", r.doubled(), strings.Join(twice, ", "))
	for _, name := range consumer.Names() {
		fmt.Fprintf(&b, "parked by %-12s %s\n", name+":", tally(r.parked[name]))
	}
	fmt.Fprintf(&b, "outbox rows:           %s\n", tally(r.outbox))
	fmt.Fprintf(&b, "inbox rows not PROCESSED: %s\n", tally(r.unready))
	fmt.Fprintf(&b, "duplicates absorbed:   %d inbox rows saw more than one delivery; the webhook got %d calls, %d of them retries of a key it had\n",
		r.redelivered, r.hookCalls, r.hookReplays)
	verdict := "PASS: nothing lost, nothing applied twice, nothing stuck"
	if !r.ok() {
		verdict = "FAIL"
	}
	fmt.Fprintln(&b, verdict)
	_, _ = io.WriteString(w, b.String())
}

func first(s []string, n int) []string { return s[:min(n, len(s))] }
