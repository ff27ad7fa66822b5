package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/yourorg/orders/internal/consumer"
	"github.com/yourorg/orders/internal/consumer/warehouse"
	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/domain"
	"github.com/yourorg/orders/internal/messaging"
	"github.com/yourorg/orders/internal/messaging/inbox"
	"github.com/yourorg/orders/internal/messaging/inbox/inboxadmin"
	"github.com/yourorg/orders/internal/messaging/outbox"
	"github.com/yourorg/orders/internal/messaging/outbox/outboxadmin"
)

// tour runs the steps in order; each returns a failure when the system did
// not do what the step says it does.
func tour(ctx context.Context, s *system, n *narrator) error {
	steps := []struct {
		title string
		run   func(context.Context, *system, *narrator, *state) error
	}{
		{"one order, end to end", stepOrder},
		{"a duplicate publish, absorbed by the inbox", stepDuplicate},
		{"a consumer killed after its commit, before its ack", stepCrash},
		{"a poison message, parked with its reason while orders flow", stepPoison},
		{"cancels racing fulfillment", stepRace},
	}
	n.steps = len(steps)
	n.say("This walkthrough drives the running order service and shows, from the database and\n"+
		"the broker, what the outbox and the inbox do. It talks to:\n%s\n"+
		"Every query it prints can be pasted into psql, every orderctl command run: from a\n"+
		"checkout, make psql and make ctl ARGS='<command>'; with docker compose,\n"+
		"docker compose exec postgres psql -U postgres -d orders and\n"+
		"docker compose run --rm orderctl <command>. Nothing here is simulated: the faults\n"+
		"are real messages and a real crash of order-consumer.", s.where)
	if absent := s.absentUIs(); absent != "" {
		n.say("Not answering: %s (make dev runs none of them, nor a compose stack started without them). Its hints point to\n"+
			"what there is instead: the order timeline page, psql, the logs, /metrics.", absent)
	}
	st := &state{}
	for _, step := range steps {
		if err := n.pause(ctx); err != nil {
			return err
		}
		n.heading(step.title)
		if err := step.run(ctx, s, n, st); err != nil {
			return err
		}
	}
	n.say("Done: every step behaved as the pattern promises. docs/failure-modes.md lists every\n" +
		"failure this service is built to survive, with the code and the test for each.")
	return nil
}

// state carries what one step leaves for the next.
type state struct {
	order order // the order of step 1
}

// subscribers maps each message type to the consumers that receive it.
func subscribers() map[string][]string {
	out := map[string][]string{}
	for _, c := range consumer.All(consumer.Deps{}) {
		for _, t := range c.Types() {
			out[t] = append(out[t], c.Name())
		}
	}
	return out
}

// expectedInbox is how many inbox rows the messages of an order make:
// one per message and consumer that receives it.
func (s *system) expectedInbox(ctx context.Context, orderID string) (int, error) {
	subs := subscribers()
	messages, _, err := s.messages(ctx, orderID)
	total := 0
	for _, m := range messages {
		total += len(subs[m.Type])
	}
	return total, err
}

// settle waits until the order's flow has come to rest.
func (s *system) settle(ctx context.Context, orderID string) error {
	want, err := s.expectedInbox(ctx, orderID)
	if err != nil {
		return err
	}
	if err := s.settled(ctx, orderID, want); err != nil {
		return err
	}
	// The last message may have written a follow-up meanwhile.
	again, err := s.expectedInbox(ctx, orderID)
	if err != nil || again == want {
		return err
	}
	return s.settled(ctx, orderID, again)
}

// outboxTable shows the order's outbox rows, oldest first.
func outboxTable(messages []outboxadmin.Message) [][]string {
	var rows [][]string
	for _, m := range messages {
		delay := "∅"
		if m.PublishedAt != nil {
			delay = ms(m.PublishedAt.Sub(m.CreatedAt))
		}
		rows = append(rows, []string{m.Type, m.Status, fmt.Sprint(m.Attempts), delay, orNull(m.CorrelationID)})
	}
	return rows
}

// inboxTable shows the order's inbox rows, the first received first.
func inboxTable(rows []inboxadmin.Row) [][]string {
	var out [][]string
	for _, r := range rows {
		out = append(out, []string{r.Consumer, r.Type, r.Status, orNull(r.Outcome), fmt.Sprint(r.Attempts), orNull(r.TraceID)})
	}
	return out
}

// orNull shows "" as the tables show a NULL.
func orNull(s string) string {
	if s == "" {
		return text(nil)
	}
	return s
}

// stamp shows a time as the tables do, nil as NULL.
func stamp(t *time.Time) string {
	if t == nil {
		return text(nil)
	}
	return text(*t)
}

func stepOrder(ctx context.Context, s *system, n *narrator, st *state) error {
	correlation := "walkthrough-" + uuid.NewString()[:8]
	n.say("POST %s/v1/orders with X-Correlation-ID: %s\n"+
		"order-api writes the order, its first history row and an order.submitted outbox row\n"+
		"in ONE transaction, and answers. It never talks to RabbitMQ.", s.cfg.APIURL, correlation)
	o, err := s.createOrder(ctx, "BOOK-1", correlation)
	if err != nil {
		return err
	}
	n.ok("201 Created: order %s, status %s", o.ID, o.Status)
	st.order = o

	n.ctl("order " + o.ID)
	messages, _, err := s.messages(ctx, o.ID)
	if err != nil {
		return err
	}
	rows := outboxTable(messages)
	n.table([]string{"message_type", "status", "attempts", "publish_delay", "correlation_id"}, rows)
	if len(rows) == 0 || rows[0][0] != domain.TypeOrderSubmitted {
		return failf("want the order.submitted outbox row committed with the order, got %v", rows)
	}
	n.say("The row's insert fired a NOTIFY; an outbox-relay woke, claimed it (FOR UPDATE SKIP\n" +
		"LOCKED), published it with a publisher confirm and marked it PUBLISHED. It may already be\n" +
		"PUBLISHED above: that takes a few milliseconds. Now the consumers move the order along:\n" +
		"fulfillment → warehouse → fulfillment → notification, each through its own queue.")

	if err := s.waitStatus(ctx, o.ID, string(domain.StatusFulfilled)); err != nil {
		return err
	}
	if err := s.settle(ctx, o.ID); err != nil {
		return err
	}
	n.ok("the order is FULFILLED and every message of it is published and processed")
	n.ctl("order " + o.ID)
	messages, inboxRows, err := s.messages(ctx, o.ID)
	if err != nil {
		return err
	}
	rows = outboxTable(messages)
	n.table([]string{"message_type", "status", "attempts", "publish_delay", "correlation_id"}, rows)
	for _, r := range rows {
		if r[1] != "PUBLISHED" || r[4] != correlation {
			return failf("want every outbox row PUBLISHED with correlation id %s, got %v", correlation, r)
		}
	}
	n.say("Each follow-up message was written by a consumer in the same transaction as its inbox\n" +
		"row and the order's transition, and carries the order's correlation id. The inbox:")
	inbox := inboxTable(inboxRows)
	n.table([]string{"consumer_name", "message_type", "status", "outcome", "attempts", "trace_id"}, inbox)
	traces := map[string]bool{}
	for _, r := range inbox {
		if r[2] != "PROCESSED" || r[3] != "APPLIED" {
			return failf("want every inbox row PROCESSED and APPLIED, got %v", r)
		}
		traces[r[5]] = true
	}
	if len(traces) == 1 && !traces["∅"] && !traces[""] {
		n.ok("one trace id on every inbox row: the whole flow of the order is one trace")
	}

	if o, err = s.getOrder(ctx, o.ID); err != nil {
		return err
	}
	st.order = o
	n.say("GET /v1/orders/%s: the history, one row per transition, each naming its cause:", o.ID)
	var hist [][]string
	for _, h := range o.History {
		cause := "HTTP request"
		if h.MessageID != nil {
			cause = "message " + *h.MessageID
		}
		hist = append(hist, []string{orEmpty(h.From), h.To, cause})
	}
	n.table([]string{"from", "to", "caused by"}, hist)
	if err := validPath(o); err != nil {
		return err
	}
	if notes, err := s.notifications(ctx, o.ID); err != nil {
		return err
	} else if notes != nil {
		n.say("The webhook receiver (%s/notifications) got these notifications:", s.cfg.WebhookURL)
		var rows [][]string
		for _, x := range notes {
			rows = append(rows, []string{x.Kind, fmt.Sprint(x.Requests)})
		}
		n.table([]string{"kind", "requests with its Idempotency-Key"}, rows)
		n.say("More than one request for a kind means the receiver refused the first (make dev and\n" +
			"docker compose start it with FAIL_FIRST=1) and the consumer retried with the SAME key:\n" +
			"the call happens outside the transaction, and the key makes it safe to repeat.")
	}
	trace := ""
	if len(inbox) > 0 {
		trace = inbox[0][5]
	}
	n.look(
		s.timelineHint(o.ID),
		s.traceHint(trace, "POST /v1/orders, each relay publish, each consumer process, the SQL, one trace"),
		s.queuesHint(s.consumerQueues()),
		s.grafanaHint("the dashboard \"Order service: outbox and inbox\"", "consumer_messages_processed_total"),
		"psql: SELECT * FROM order_state_transition WHERE order_id = '"+o.ID+"';",
		"orderctl order "+o.ID+" : all of the above in one timeline (from a checkout: make ctl ARGS='order "+o.ID+"';\n"+
			"  with docker compose: docker compose run --rm orderctl order "+o.ID+")",
	)
	return nil
}

func stepDuplicate(ctx context.Context, s *system, n *narrator, st *state) error {
	o := st.order
	row, err := s.outboxRow(ctx, o.ID, domain.TypeOrderSubmitted)
	if err != nil {
		return err
	}
	n.say("A relay that publishes a row and dies (or loses the connection) before it marks the row\n"+
		"PUBLISHED publishes it again after its lease ends: at-least-once. The walkthrough does the\n"+
		"same now: it sends the order.submitted message of step 1 again, built from the outbox row\n"+
		"exactly as the relay builds it, with the same message_id %s.", row.ID)
	received := func(ctx context.Context) ([][]string, error) { // the consumers' rows of the message
		_, rows, err := s.messages(ctx, o.ID)
		var out [][]string
		for _, r := range rows {
			if r.MessageID == row.ID.String() {
				out = append(out, []string{r.Consumer, r.Status, fmt.Sprint(r.Attempts), stamp(r.ProcessedAt), text(r.LastReceivedAt)})
			}
		}
		slices.SortFunc(out, func(a, b []string) int { return strings.Compare(a[0], b[0]) })
		return out, err
	}
	before, err := received(ctx)
	if err != nil {
		return err
	}
	n.ctl("order " + o.ID)
	n.table([]string{"consumer_name", "status", "attempts", "processed_at", "last_received_at"}, before)
	dupBefore, err := s.consumerMetric(ctx, "consumer_messages_duplicates_total", "")
	if err != nil {
		return err
	}
	histBefore := len(o.History)
	notesBefore, err := s.notifications(ctx, o.ID)
	if err != nil {
		return err
	}

	if err := s.publish(ctx, row.Exchange, row.RoutingKey, envelope(row)); err != nil {
		return err
	}
	n.ok("published again to %s with routing key %s; the broker confirmed it", row.Exchange, row.RoutingKey)
	var after [][]string
	err = waitUntil(ctx, s.cfg.Timeout, "every consumer to receive the duplicate", func(ctx context.Context) (bool, error) {
		var err error
		if after, err = received(ctx); err != nil || len(after) != len(before) {
			return false, err
		}
		for i := range after {
			if after[i][4] == before[i][4] {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return err
	}
	n.table([]string{"consumer_name", "status", "attempts", "processed_at", "last_received_at"}, after)
	for i := range after {
		if after[i][1] != "PROCESSED" || after[i][2] != before[i][2] || after[i][3] != before[i][3] {
			return failf("the duplicate changed the inbox row: before %v, after %v", before[i], after[i])
		}
	}
	n.ok("each consumer received it (last_received_at moved) and applied nothing: same status, attempts, processed_at")
	if o, err = s.getOrder(ctx, o.ID); err != nil {
		return err
	}
	if len(o.History) != histBefore || o.Status != string(domain.StatusFulfilled) {
		return failf("the duplicate changed the order: %s, %d transitions (was %d)", o.Status, len(o.History), histBefore)
	}
	n.ok("the order is still %s with the same %d transitions", o.Status, histBefore)
	notesAfter, err := s.notifications(ctx, o.ID)
	if err != nil {
		return err
	}
	if fmt.Sprint(notesAfter) != fmt.Sprint(notesBefore) {
		return failf("the duplicate reached the webhook receiver: before %v, after %v", notesBefore, notesAfter)
	}
	if notesAfter != nil {
		n.ok("the webhook receiver saw no new request: the customer was not told twice")
	}
	var dupAfter float64
	err = waitUntil(ctx, s.cfg.Timeout, "the duplicates counter to move", func(ctx context.Context) (bool, error) {
		var err error
		dupAfter, err = s.consumerMetric(ctx, "consumer_messages_duplicates_total", "")
		return dupAfter >= dupBefore+float64(len(after)), err
	})
	if err != nil {
		return err
	}
	n.ok("consumer_messages_duplicates_total: %.0f → %.0f (%s)", dupBefore, dupAfter, s.metricHint("consumer_messages_duplicates_total"))
	n.look(
		"the consumer's log: a line \"duplicate\" per consumer with message_id "+row.ID.String(),
		s.traceHint("", "the order's trace has new process spans (the message carries the row's traceparent)"),
		s.grafanaHint("\"Duplicates per consumer\"", "consumer_messages_duplicates_total"),
	)
	return nil
}

func stepCrash(ctx context.Context, s *system, n *narrator, st *state) error {
	n.say("The worst moment for a consumer to die is after its transaction commits and before it\n"+
		"acknowledges the delivery: the work is done, but the broker does not know and delivers the\n"+
		"message again. The walkthrough arms a one-shot fault in order-consumer (POST\n"+
		"%s/faults/crash-after-commit, enabled by CONSUMER_FAULTS_ENDPOINT=true): the next\n"+
		"fulfillment.requested the warehouse commits makes the process exit at once (code 3).\n"+
		"docker compose (restart: unless-stopped) or make dev starts it again.", s.cfg.ConsumerAdminURL)
	if err := s.armCrash(ctx, domain.TypeFulfillmentRequested); err != nil {
		return err
	}
	n.ok("fault armed")
	o, err := s.createOrder(ctx, "BOOK-2", "walkthrough-crash-"+uuid.NewString()[:8])
	if err != nil {
		return err
	}
	n.ok("created order %s", o.ID)
	sawDown := false
	err = waitUntil(ctx, s.cfg.Timeout, "order-consumer to be back after its crash and the order FULFILLED", func(ctx context.Context) (bool, error) {
		if s.ready(ctx, s.cfg.ConsumerAdminURL+"/healthz") != nil {
			sawDown = true
			return false, nil
		}
		var status string
		err := s.db.QueryRow(ctx, `SELECT status FROM orders WHERE order_id = $1`, o.ID).Scan(&status)
		return status == string(domain.StatusFulfilled), err
	})
	if err != nil {
		return fmt.Errorf("%w (is order-consumer restarted when it exits? docker compose and make dev do it)", err)
	}
	if sawDown {
		n.ok("order-consumer went down and came back")
	}
	_, inboxRows, err := s.messages(ctx, o.ID)
	if err != nil {
		return err
	}
	var held [][]string
	for _, r := range inboxRows {
		if r.Status == inbox.StatusProcessing {
			held = append(held, []string{r.Consumer, r.Type, r.Status, stamp(r.ProcessingStartedAt)})
		}
	}
	if len(held) > 0 {
		n.say("The crash also caught a consumer between the two steps of an external call (the\n" +
			"notification's webhook runs outside the transaction, between a PROCESSING mark and the\n" +
			"final commit):")
		n.ctl("order " + o.ID)
		n.table([]string{"consumer_name", "message_type", "status", "processing_started_at"}, held)
		n.say("Its redeliveries are retried as \"busy\" until CONSUMER_PROCESSING_LEASE passes since\n" +
			"processing_started_at (the process that marked it could still be calling); then one\n" +
			"takes over and calls the webhook again with the same Idempotency-Key. Waiting for it.")
	}
	if err := s.settle(ctx, o.ID); err != nil {
		return err
	}
	var rows [][]string
	err = waitUntil(ctx, s.cfg.Timeout, "the warehouse to receive fulfillment.requested again", func(ctx context.Context) (bool, error) {
		_, inboxRows, err := s.messages(ctx, o.ID)
		rows = nil
		for _, r := range inboxRows {
			if r.Consumer == warehouse.Name {
				again := text(nil) // received again after the commit
				if r.ProcessedAt != nil {
					again = fmt.Sprint(r.LastReceivedAt.After(*r.ProcessedAt))
				}
				rows = append(rows, []string{r.Consumer, r.Type, r.Status, fmt.Sprint(r.Attempts), stamp(r.ProcessedAt), text(r.LastReceivedAt), again})
			}
		}
		return len(rows) == 1 && rows[0][6] == "true", err
	})
	n.ctl("order " + o.ID)
	n.table([]string{"consumer_name", "message_type", "status", "attempts", "processed_at", "last_received_at", "redelivered_after_commit"}, rows)
	if err != nil {
		return err
	}
	if len(rows) != 1 || rows[0][1] != domain.TypeFulfillmentRequested || rows[0][2] != "PROCESSED" || rows[0][3] != "1" || rows[0][6] != "true" {
		return failf("want one warehouse inbox row, PROCESSED once, received again after its commit; got %v", rows)
	}
	n.ok("the warehouse processed fulfillment.requested once (attempts 1) and received it again after the commit")
	const rq = `SELECT count(*) AS reservations FROM stock_reservation WHERE order_id = $1`
	n.sql(strings.ReplaceAll(rq, "$1", "'"+o.ID+"'"))
	res, err := s.rows(ctx, rq, o.ID)
	if err != nil {
		return err
	}
	n.table([]string{"reservations"}, res)
	if res[0][0] != "1" {
		return failf("want exactly one stock reservation for the order, got %s", res[0][0])
	}
	if o, err = s.getOrder(ctx, o.ID); err != nil {
		return err
	}
	if err := validPath(o); err != nil {
		return err
	}
	n.ok("one reservation, and the history %s: the redelivery changed nothing", o.path())
	var dups float64
	err = waitUntil(ctx, s.cfg.Timeout, "the restarted consumer to count the redelivery as a duplicate", func(ctx context.Context) (bool, error) {
		var err error
		dups, err = s.consumerMetric(ctx, "consumer_messages_duplicates_total", warehouse.Name)
		return dups >= 1, err
	})
	if err != nil {
		return err
	}
	n.ok("the restarted order-consumer counted it: consumer_messages_duplicates_total{consumer_name=\"warehouse\"} = %.0f", dups)
	n.look(
		"the consumer's log: \"fault injection: exiting after the commit, before the ack\", then after the restart a \"duplicate\" line for the same message_id",
		s.queuesHint("the connection of order-consumer is new; the message was redelivered (redelivered flag)"),
	)
	return nil
}

func stepPoison(ctx context.Context, s *system, n *narrator, _ *state) error {
	poisonID := uuid.Must(uuid.NewV7()).String()
	n.say("A message no consumer can ever handle (a producer bug: a body cut short, not JSON) must not\n"+
		"block its queue or loop forever. The walkthrough publishes one to orders.events with routing\n"+
		"key order.submitted (message_id %s), and at the same time a good order.", poisonID)
	subs := subscribers()[domain.TypeOrderSubmitted]
	depth := map[string]int{}
	for _, c := range subs {
		d, err := s.queueDepth(inbox.ParkingLotName(inbox.QueueName(c)))
		if err != nil {
			return err
		}
		depth[c] = d
	}
	poison := amqp.Publishing{
		MessageId: poisonID, Type: domain.TypeOrderSubmitted, ContentType: messaging.ContentTypeJSON,
		DeliveryMode: amqp.Persistent, Timestamp: time.Now(), CorrelationId: "walkthrough-poison",
		// A partition, for a system that runs with MESSAGE_PARTITIONS (the
		// topic exchange of one that does not ignores it).
		Headers: amqp.Table{messaging.HeaderMessageVersion: int32(1), messaging.HeaderCorrelationID: "walkthrough-poison", outbox.HeaderPartition: int32(0)},
		Body:    []byte(`{"order_id": "` + uuid.NewString() + `", "items": [{"sku": "BO`),
	}
	if err := s.publish(ctx, "orders.events", domain.TypeOrderSubmitted, poison); err != nil {
		return err
	}
	o, err := s.createOrder(ctx, "BOOK-3", "walkthrough-poison-neighbour")
	if err != nil {
		return err
	}
	n.ok("published the poison message, and created order %s", o.ID)
	if err := s.waitStatus(ctx, o.ID, string(domain.StatusFulfilled)); err != nil {
		return err
	}
	n.ok("order %s went through: FULFILLED", o.ID)
	var rows [][]string
	err = waitUntil(ctx, s.cfg.Timeout, "every consumer to park the poison message", func(ctx context.Context) (bool, error) {
		rows = nil
		for _, c := range slices.Sorted(slices.Values(subs)) {
			r, err := inboxadmin.Get(ctx, s.db, c, poisonID)
			if errors.Is(err, database.ErrNotFound) {
				return false, nil
			} else if err != nil {
				return false, err
			}
			rows = append(rows, []string{r.Consumer, r.Status, fmt.Sprint(r.Attempts), orNull(r.LastErrorCode), orNull(r.LastErrorMessage)})
		}
		for _, r := range rows {
			if r[1] != "PERMANENT_FAILED" {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return err
	}
	n.ctl("inbox show <consumer> " + poisonID)
	n.table([]string{"consumer_name", "status", "attempts", "last_error_code", "last_error_message"}, rows)
	n.ok("each consumer recorded it PERMANENT_FAILED on the first attempt: retrying cannot fix a broken body")
	for _, c := range subs {
		dlq := inbox.ParkingLotName(inbox.QueueName(c))
		var now int
		err := waitUntil(ctx, s.cfg.Timeout, dlq+" to hold the message", func(context.Context) (bool, error) {
			var err error
			now, err = s.queueDepth(dlq)
			return now > depth[c], err
		})
		if err != nil {
			return err
		}
		n.ok("%s: %d → %d messages", dlq, depth[c], now)
	}
	dlq := inbox.ParkingLotName(inbox.QueueName(subs[0]))
	d, err := s.peek(dlq, poisonID)
	if err != nil {
		return err
	}
	n.say("The parked message in %s (read and put back), with the headers that say why:", dlq)
	var hdr [][]string
	for _, h := range inbox.Headers {
		if v, ok := d.Headers[h.Name]; ok && strings.HasPrefix(h.Name, "parked_") {
			hdr = append(hdr, []string{h.Name, fmt.Sprint(v)})
		}
	}
	n.table([]string{"header", "value"}, hdr)
	if code, _ := inboxadmin.ParkedReason(d.Headers); code != "schema_violation" {
		return failf("want parked_reason_code schema_violation, got %q", code)
	}
	n.ok("parked with its reason; the body is kept as it came, for whoever fixes the producer")
	n.look(
		s.queuesHint(dlq+" → Get messages shows it with these headers"),
		"the consumer's log: one \"parked\" line per consumer with message_id "+poisonID+" and the reason, never the payload",
		"orderctl parked show "+subs[0]+" "+poisonID+" : the same, from the terminal, leaving it where it is",
		"docs/operations.md: replaying parked messages (orderctl parked replay) once their cause is fixed;\n"+
			"      this one is broken for good: an operator reads it and discards it (orderctl parked discard ... --reason)",
	)
	return nil
}

// raceStep spaces the cancels of the race, so that some land before the
// fulfillment completes and some after (it takes ~10 ms on a laptop).
const raceStep = 8 * time.Millisecond

func stepRace(ctx context.Context, s *system, n *narrator, _ *state) error {
	const orders = 8
	n.say("A customer cancels while the consumers fulfil the order. Whoever commits first wins, and\n"+
		"the other side must see it: a cancel that wins makes the late fulfillment messages\n"+
		"no-ops (inbox outcome IGNORED) and the warehouse releases the stock; a fulfillment that\n"+
		"wins makes the cancel a 409. The walkthrough creates %d orders and cancels each after\n"+
		"0 to %d ms, all at once.", orders, (orders-1)*raceStep/time.Millisecond)
	type result struct {
		id     string
		cancel int
		err    error
	}
	results := make([]result, orders)
	var wg sync.WaitGroup
	for i := range orders {
		wg.Go(func() {
			o, err := s.createOrder(ctx, fmt.Sprintf("GAME-%d", i), "walkthrough-race")
			if err != nil {
				results[i].err = err
				return
			}
			time.Sleep(time.Duration(i) * raceStep)
			results[i].id = o.ID
			results[i].cancel, results[i].err = s.cancelOrder(ctx, o.ID)
		})
	}
	wg.Wait()
	var table [][]string
	won := 0
	for _, r := range results {
		if r.err != nil {
			return r.err
		}
		var want string
		switch r.cancel {
		case 200:
			want, won = string(domain.StatusCancelled), won+1
		case 409:
			want = string(domain.StatusFulfilled)
		default:
			return failf("cancel of %s answered %d, want 200 or 409", r.id, r.cancel)
		}
		if err := s.waitStatus(ctx, r.id, want); err != nil {
			return err
		}
		wantReservation := map[bool]string{true: "RELEASED", false: "RESERVED"}[want == string(domain.StatusCancelled)]
		var reservation string
		err := waitUntil(ctx, s.cfg.Timeout, "the reservation of "+r.id+" to be "+wantReservation, func(ctx context.Context) (bool, error) {
			err := s.db.QueryRow(ctx, `SELECT status FROM stock_reservation WHERE order_id = $1`, r.id).Scan(&reservation)
			return reservation == wantReservation, err
		})
		if err != nil {
			return err
		}
		if err := s.settle(ctx, r.id); err != nil {
			return err
		}
		o, err := s.getOrder(ctx, r.id)
		if err != nil {
			return err
		}
		if err := validPath(o); err != nil {
			return err
		}
		messages, inboxRows, err := s.messages(ctx, r.id)
		if err != nil {
			return err
		}
		var types []string
		for _, m := range messages {
			types = append(types, m.Type)
		}
		count := func(t string) int {
			return len(slices.DeleteFunc(slices.Clone(types), func(typ string) bool { return typ != t }))
		}
		if want == string(domain.StatusCancelled) && (count(domain.TypeOrderCancelled) != 1 || count(domain.TypeOrderFulfilled) != 0) ||
			want == string(domain.StatusFulfilled) && (count(domain.TypeOrderCancelled) != 0 || count(domain.TypeOrderFulfilled) != 1) {
			return failf("order %s is %s but its outbox holds %v", r.id, want, types)
		}
		var ig []string
		for _, x := range inboxRows {
			if x.Outcome == inbox.OutcomeIgnored {
				ig = append(ig, x.Consumer+": "+x.Type)
			}
		}
		table = append(table, []string{short(r.id), fmt.Sprint(r.cancel), o.Status, o.path(), reservation, orEmpty(strings.Join(ig, ", "))})
	}
	n.table([]string{"order", "cancel", "final", "history", "stock", "ignored (stale) messages"}, table)
	n.ok("%d cancels won, %d lost to fulfillment; every order consistent: its status, history, outbox\n"+
		"    messages and stock reservation agree", won, orders-won)
	if won == 0 || won == orders {
		n.say("All the races went one way this time; run the walkthrough again to see the other.")
	}
	n.look(
		"why each stale message was ignored: orderctl order <order_id>, the outcome_reason of its IGNORED inbox rows",
		"docs/state-machines.md: the order state machine and how a stale trigger is told from an impossible one",
	)
	return nil
}

// validPath checks the history against the state machine: created
// SUBMITTED, then only allowed transitions.
func validPath(o order) error {
	if len(o.History) == 0 || o.History[0].From != "" || o.History[0].To != string(domain.StatusSubmitted) {
		return failf("order %s: the history must start with its creation as SUBMITTED: %s", o.ID, o.path())
	}
	for _, h := range o.History[1:] {
		if !slices.ContainsFunc(domain.Transitions, func(t domain.Transition) bool {
			return string(t.From) == h.From && string(t.To) == h.To
		}) {
			return failf("order %s: %s → %s is not a transition of the state machine", o.ID, h.From, h.To)
		}
	}
	if last := o.History[len(o.History)-1].To; last != o.Status {
		return failf("order %s is %s but its history ends at %s", o.ID, o.Status, last)
	}
	return nil
}

func orEmpty(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// absentUIs names the web UIs of the hints that do not answer.
func (s *system) absentUIs() string {
	var absent []string
	for _, ui := range []struct {
		name string
		up   bool
	}{
		{"Jaeger (JAEGER_URL " + s.cfg.JaegerURL + ")", s.jaeger},
		{"the RabbitMQ management UI (RABBITMQ_UI_URL " + s.cfg.RabbitUIURL + ")", s.rabbitUI},
		{"Grafana (GRAFANA_URL " + s.cfg.GrafanaURL + ")", s.grafana},
	} {
		if !ui.up {
			absent = append(absent, ui.name)
		}
	}
	return strings.Join(absent, ", ")
}

// timelineHint points the browser to the order's timeline page.
func (s *system) timelineHint(orderID string) string {
	return fmt.Sprintf("the order's timeline %s/ui/orders/%s : every hop above in time order, and the trace id", s.cfg.APIBrowserURL, orderID)
}

// traceHint points to a trace in Jaeger, or, without Jaeger, to the
// order timeline page and the console exporter.
func (s *system) traceHint(traceID, what string) string {
	if s.jaeger {
		if traceID == "" {
			return "Jaeger " + s.cfg.JaegerBrowserURL + " : " + what
		}
		return fmt.Sprintf("Jaeger %s/trace/%s : %s", s.cfg.JaegerBrowserURL, traceID, what)
	}
	return "no Jaeger: the timeline page names the trace id; OTEL_TRACES_EXPORTER=console make dev prints the spans in the logs"
}

// consumerQueues names the consumers' queues as the system declares
// them: a work queue per partition, or one work queue and its retry
// queues (MESSAGE_PARTITIONS=0), and a parking lot each.
func (s *system) consumerQueues() string {
	if n := s.partitions(); n > 0 {
		return fmt.Sprintf("orders.fulfillment.p0 to .p%d, one per partition, the same for orders.warehouse and orders.notification, and their .dlq", n-1)
	}
	return "orders.fulfillment, orders.warehouse, orders.notification, their .retry.* and .dlq"
}

// queuesHint points to the RabbitMQ management UI's queues, or, without
// it, to rabbitmqctl.
func (s *system) queuesHint(what string) string {
	if s.rabbitUI {
		return fmt.Sprintf("RabbitMQ %s/#/queues : %s", s.cfg.RabbitUIBrowserURL, what)
	}
	vhost := "/"
	if uri, err := amqp.ParseURI(s.cfg.AMQPURL); err == nil {
		vhost = uri.Vhost
	}
	return fmt.Sprintf("no RabbitMQ management UI: rabbitmqctl list_queues -p '%s' name messages_ready messages_unacknowledged "+
		"shows the queues (or enable the UI: rabbitmq-plugins enable rabbitmq_management)", vhost)
}

// grafanaHint points to a Grafana panel, or, without Grafana, to the
// metric (metricHint).
func (s *system) grafanaHint(panel, metric string) string {
	if s.grafana {
		return fmt.Sprintf("Grafana %s : %s", s.cfg.GrafanaBrowserURL, panel)
	}
	return "no Grafana: " + s.metricHint(metric)
}

// metricHint links a metric for the browser: its graph in Prometheus, or,
// without Prometheus (make dev), the consumer's /metrics, which the
// browser reaches there; in compose the consumer's admin port is
// published nowhere.
func (s *system) metricHint(metric string) string {
	if s.prometheus {
		return fmt.Sprintf("Prometheus %s/graph?g0.expr=%s", s.cfg.PrometheusBrowserURL, url.QueryEscape(metric))
	}
	return fmt.Sprintf("%s on %s/metrics", metric, s.cfg.ConsumerAdminURL)
}
