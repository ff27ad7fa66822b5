package failover

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/yourorg/orders/internal/consumer"
	"github.com/yourorg/orders/internal/testenv"
)

// Path is the history of an order the load places, one transition per
// step, to final (FULFILLED or REJECTED).
func Path(final string) []string {
	return []string{">SUBMITTED", "SUBMITTED>FULFILLMENT_REQUESTED", "FULFILLMENT_REQUESTED>" + final}
}

// AppliedTwiceQueries count, each, what a second application of a
// message would leave: rows that exist once per order (and kind).
var AppliedTwiceQueries = map[string]string{
	"order transitions (order, to status)":     "SELECT count(*) FROM (SELECT 1 FROM order_state_transition GROUP BY order_id, to_status HAVING count(*) > 1) t",
	"follow-up messages (order, message type)": "SELECT count(*) FROM (SELECT 1 FROM message_outbox GROUP BY aggregate_id, message_type HAVING count(*) > 1) t",
	"stock reservations per order":             "SELECT count(*) FROM (SELECT 1 FROM stock_reservation GROUP BY order_id HAVING count(*) > 1) t",
	"shipments per order":                      "SELECT count(*) FROM (SELECT 1 FROM shipment GROUP BY order_id HAVING count(*) > 1) t",
	"notifications (order, kind)":              "SELECT count(*) FROM (SELECT 1 FROM customer_notification GROUP BY order_id, kind HAVING count(*) > 1) t",
}

// Result is the accounting of a run: what the promise allows to be only
// zero (Lost, Ghosts, Rowless, NeverReceived, AppliedTwice, Unpublished),
// and what the measures of each failover read.
type Result struct {
	Orders int            // answered 201
	Final  map[string]int // orders by final status
	// Lost: orders answered 201 that are not in the database, or not in
	// the status they should end in with one transition per step.
	Lost int
	// Ghosts: messages the broker carried about an order the database does
	// not have; Rowless: of an outbox row it does not have.
	Ghosts, Rowless int
	// NeverReceived: published messages of a type a consumer reads that
	// it never received.
	NeverReceived int
	AppliedTwice  int
	// Unpublished: outbox rows not PUBLISHED, inbox rows not PROCESSED,
	// once the flow had settled.
	Unpublished int
	// Carried: messages the broker carried (a message published again
	// counts again); Rows: outbox rows.
	Carried, Rows int
	// Latest is the latest message: the longest from its outbox row's
	// creation to its first publish.
	Latest Late

	orderCreated map[string]time.Time // by order id
	rowCreated   map[string]time.Time // by outbox id
	firstPublish map[string]time.Time // by outbox id: when the tap first saw it
	processed    []time.Time          // every inbox row's processed_at
	answered     []Order
}

// Late is a message and how late it was published.
type Late struct {
	ID, Type         string
	Created, Publish time.Time
	Lateness         time.Duration // Publish - Created
	// Order is every message of its order: a message waits for the
	// earlier ones of its aggregate to be published.
	Order []OrderMessage
}

// OrderMessage is one message of an order, with its outbox row's
// creation and every time the broker carried it.
type OrderMessage struct {
	ID, Type  string
	Created   time.Time
	Published []time.Time
}

// String says when the message's row was written and published.
func (m OrderMessage) String() string {
	times := make([]string, len(m.Published))
	for i, at := range m.Published {
		times[i] = at.Format(clock)
	}
	return fmt.Sprintf("%s (%s) written at %s, published at %v", m.ID, m.Type, m.Created.Format(clock), times)
}

// Account waits until the flow has settled (every order final, every
// outbox row published, every inbox row processed; t fails when that does
// not happen within minutes: something was lost), then checks the
// database of dbURL against the orders answered 201 and the messages the
// tap saw. Each breach of the promise fails t, saying what it is.
func Account(t testing.TB, dbURL string, orders []Order, seen []Tapped) *Result {
	t.Helper()
	ctx := context.Background()
	db, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(ctx)
	count := func(query string, args ...any) int {
		t.Helper()
		var n int
		if err := db.QueryRow(ctx, query, args...).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	r := &Result{Orders: len(orders), Final: map[string]int{}, Carried: len(seen), answered: orders,
		orderCreated: map[string]time.Time{}, rowCreated: map[string]time.Time{}, firstPublish: map[string]time.Time{}}

	testenv.WaitFor(t, 3*time.Minute, "every order to be final", func() bool {
		return count("SELECT count(*) FROM orders WHERE status NOT IN ('FULFILLED', 'REJECTED', 'CANCELLED')") == 0
	})
	unsettled := func() int {
		return count("SELECT count(*) FROM message_outbox WHERE status <> 'PUBLISHED'") +
			count("SELECT count(*) FROM message_inbox WHERE status <> 'PROCESSED'")
	}
	deadline := time.Now().Add(time.Minute)
	for r.Unpublished = unsettled(); r.Unpublished > 0 && time.Now().Before(deadline); r.Unpublished = unsettled() {
		time.Sleep(100 * time.Millisecond)
	}
	if r.Unpublished > 0 {
		t.Errorf("a minute after every order was final, %d outbox rows not PUBLISHED and inbox rows not PROCESSED", r.Unpublished)
	}

	// Lost: an order answered 201 that is not final, or not there.
	for _, o := range orders {
		var status string
		var history []string
		var created time.Time
		err := db.QueryRow(ctx, `SELECT o.status, o.created_at, array_agg(coalesce(t.from_status, '') || '>' || t.to_status ORDER BY t.transition_id)
			FROM orders o JOIN order_state_transition t USING (order_id) WHERE o.order_id = $1 GROUP BY o.status, o.created_at`, o.ID).
			Scan(&status, &created, &history)
		switch {
		case err != nil:
			t.Errorf("lost: order %s, answered 201 at %s, is not in the database: %v", o.ID, o.Answered.Format(clock), err)
			r.Lost++
		case status != o.Want() || !slices.Equal(history, Path(status)):
			t.Errorf("lost: order %s is %s (history %v), want %s", o.ID, status, history, o.Want())
			r.Lost++
		}
		r.Final[status]++
		r.orderCreated[o.ID] = created
	}
	if n := count("SELECT count(*) FROM orders"); n != len(orders) {
		t.Errorf("%d orders in the database, %d answered 201", n, len(orders))
	}

	// Ghosts: a message the broker carried whose outbox row, or order,
	// the database does not have.
	rows, err := db.Query(ctx, "SELECT outbox_id::text, created_at FROM message_outbox")
	if err != nil {
		t.Fatal(err)
	}
	var id string
	var created time.Time
	if _, err := pgx.ForEachRow(rows, []any{&id, &created}, func() error {
		r.rowCreated[id] = created
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	r.Rows = len(r.rowCreated)
	rows, err = db.Query(ctx, "SELECT order_id::text FROM orders")
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	existing := map[string]struct{}{}
	for _, id := range ids {
		existing[id] = struct{}{}
	}
	for _, m := range seen {
		if _, ok := r.firstPublish[m.ID]; !ok {
			r.firstPublish[m.ID] = m.At
		}
		_, orderExists := existing[m.OrderID]
		_, rowExists := r.rowCreated[m.ID]
		if !orderExists {
			t.Errorf("ghost: message %s (%s) published at %s for order %s, which the database does not have", m.ID, m.Type, m.At.Format(clock), m.OrderID)
			r.Ghosts++
		} else if !rowExists {
			t.Errorf("ghost: message %s (%s) published at %s has no outbox row in the database", m.ID, m.Type, m.At.Format(clock))
			r.Rowless++
		}
	}
	for _, id := range slices.Sorted(maps.Keys(r.firstPublish)) {
		created, ok := r.rowCreated[id]
		if !ok {
			continue
		}
		if late := r.firstPublish[id].Sub(created); late > r.Latest.Lateness {
			r.Latest = Late{ID: id, Created: created, Publish: r.firstPublish[id], Lateness: late}
		}
	}
	for _, m := range seen {
		if m.ID == r.Latest.ID {
			r.Latest.Type = m.Type
			r.Latest.Order = orderMessages(m.OrderID, seen, r.rowCreated)
			break
		}
	}
	// Published, of a type a consumer reads, never received.
	for _, cons := range consumer.All(consumer.Deps{}) {
		n := count(`SELECT count(*) FROM message_outbox o WHERE status = 'PUBLISHED' AND message_type = ANY($2)
			AND NOT EXISTS (SELECT 1 FROM message_inbox i WHERE i.consumer_name = $1 AND i.message_id = o.outbox_id::text)`,
			cons.Name(), cons.Types())
		if n > 0 {
			t.Errorf("lost: consumer %s never received %d published messages", cons.Name(), n)
		}
		r.NeverReceived += n
	}
	for _, what := range slices.Sorted(maps.Keys(AppliedTwiceQueries)) {
		if n := count(AppliedTwiceQueries[what]); n > 0 {
			t.Errorf("applied twice: %d %s", n, what)
			r.AppliedTwice += n
		}
	}

	rows, err = db.Query(ctx, "SELECT processed_at FROM message_inbox WHERE processed_at IS NOT NULL ORDER BY processed_at")
	if err != nil {
		t.Fatal(err)
	}
	if r.processed, err = pgx.CollectRows(rows, pgx.RowTo[time.Time]); err != nil {
		t.Fatal(err)
	}
	return r
}

// clock is how times are logged.
const clock = "15:04:05.000"

// orderMessages is every message of order the broker carried, in the
// order of their rows' creation.
func orderMessages(order string, seen []Tapped, rowCreated map[string]time.Time) []OrderMessage {
	byID := map[string]*OrderMessage{}
	var out []*OrderMessage
	for _, m := range seen {
		if m.OrderID != order {
			continue
		}
		om := byID[m.ID]
		if om == nil {
			om = &OrderMessage{ID: m.ID, Type: m.Type, Created: rowCreated[m.ID]}
			byID[m.ID] = om
			out = append(out, om)
		}
		om.Published = append(om.Published, m.At)
	}
	slices.SortFunc(out, func(a, b *OrderMessage) int { return a.Created.Compare(b.Created) })
	msgs := make([]OrderMessage, len(out))
	for i, om := range out {
		msgs[i] = *om
	}
	return msgs
}
