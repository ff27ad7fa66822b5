package outboxtest

import (
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/yourorg/orders/internal/messaging"
	"github.com/yourorg/orders/internal/messaging/outbox"
	"github.com/yourorg/orders/internal/testenv"
)

// The messages of one aggregate go out one at a time, in the order they
// were written: a message the broker refuses holds the later ones of its
// aggregate back until it is published, while other aggregates flow.
func testMessagesOfOneAggregateGoOutInOrder(t *testing.T, mode Mode) {
	t.Parallel()
	b := Setup(t, mode)
	b.FullQueue("full", TypeRejected) // the first message of the aggregate is nacked while it is there
	b.BindQueue("observer", TypeCancelled)
	aggregate := uuid.New()
	var want []string
	for i, typ := range []string{TypeRejected, TypeCancelled, TypeCancelled, TypeCancelled} {
		ids, err := Writer.Write(b.Ctx, b.Pool, messaging.Cause{}, Message{Type: typ, ID: aggregate})
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, ids[0].String())
		_ = i
	}
	other := b.Enqueue(3, messaging.Cause{}) // other aggregates: not held
	b.StartRelay(Config(), b.AMQPURL, nil)

	if got := b.Receive("observer", len(other), 15*time.Second, 0); !sameSet(messageIDs(got), uuidStrings(other)) {
		t.Fatalf("the other aggregates: received %v, want %v", messageIDs(got), other)
	}
	testenv.WaitFor(t, 15*time.Second, "the first message to be nacked twice", func() bool {
		return b.CounterWith("outbox.publish.attempts", "outcome", "nacked") >= 2
	})
	if n := b.QueueReady("observer"); n != 0 {
		t.Fatalf("%d later messages of the aggregate overtook the one the broker refused", n)
	}

	// The broker takes the first one now: all four arrive, in order.
	if _, err := b.Ch.QueueDelete("full", false, false, false); err != nil {
		t.Fatal(err)
	}
	if err := b.Ch.QueueBind("observer", TypeRejected, Exchange, false, nil); err != nil {
		t.Fatal(err)
	}
	if got := arrivalOrder(b.Receive("observer", len(want), 30*time.Second, 0)); !slices.Equal(got, want) {
		t.Fatalf("received %v, want %v in that order", got, want)
	}
}

// With partitions, every message carries its aggregate's partition
// (outbox.PartitionOf: the consumers' partition queues route by it), from
// the log stream and from the sweep alike, and an aggregate's messages
// arrive in the order they were written, one the broker refused holding
// the later ones back.
func testPartitionedMessagesCarryTheirPartitionInOrder(t *testing.T, mode Mode) {
	t.Parallel()
	b := Setup(t, mode)
	b.FullQueue("full", TypeRejected) // the refused aggregate's first message is nacked while it is there
	b.BindQueue("observer", TypeCancelled)
	const partitions = 8
	cfg := Config()
	cfg.Partitions = partitions
	aggregateOf := map[string]uuid.UUID{}
	written := map[uuid.UUID][]string{}
	write := func(aggregate uuid.UUID, typ string) {
		ids, err := Writer.Write(b.Ctx, b.Pool, messaging.Cause{}, Message{Type: typ, ID: aggregate})
		if err != nil {
			t.Fatal(err)
		}
		aggregateOf[ids[0].String()] = aggregate
		written[aggregate] = append(written[aggregate], ids[0].String())
	}
	refused := uuid.New()
	write(refused, TypeRejected)
	others := make([]uuid.UUID, 12)
	for i := range others {
		others[i] = uuid.New()
	}
	for range 3 { // each aggregate's messages in transactions of their own, interleaved
		for _, a := range others {
			write(a, TypeCancelled)
		}
		write(refused, TypeCancelled)
	}
	b.StartRelay(cfg, b.AMQPURL, nil)

	check := func(ds []amqp.Delivery) map[uuid.UUID][]string {
		t.Helper()
		arrived := map[uuid.UUID][]string{}
		for _, d := range ds {
			a := aggregateOf[d.MessageId]
			p, ok := d.Headers[outbox.HeaderPartition].(int32)
			if want := outbox.PartitionOf(a.String(), partitions); !ok || int(p) != want {
				t.Fatalf("message %s of aggregate %s has partition header %v, want %d", d.MessageId, a, d.Headers[outbox.HeaderPartition], want)
			}
			arrived[a] = append(arrived[a], d.MessageId)
		}
		return arrived
	}
	arrived := check(b.Receive("observer", 3*len(others), 20*time.Second, 0))
	for _, a := range others {
		if !slices.Equal(arrived[a], written[a]) {
			t.Fatalf("aggregate %s: received %v, want %v in that order", a, arrived[a], written[a])
		}
	}
	testenv.WaitFor(t, 15*time.Second, "the refused aggregate's first message to be nacked", func() bool {
		return b.CounterWith("outbox.publish.attempts", "outcome", "nacked") >= 1
	})
	if n := b.QueueReady("observer"); n != 0 {
		t.Fatalf("%d later messages of the aggregate overtook the one the broker refused", n)
	}
	if _, err := b.Ch.QueueDelete("full", false, false, false); err != nil {
		t.Fatal(err)
	}
	if err := b.Ch.QueueBind("observer", TypeRejected, Exchange, false, nil); err != nil {
		t.Fatal(err)
	}
	if got := check(b.Receive("observer", 4, 30*time.Second, 0))[refused]; !slices.Equal(got, written[refused]) {
		t.Fatalf("the refused aggregate: received %v, want %v in that order", got, written[refused])
	}
}

// With RELAY_PARTITIONS, relays share the partitions instead of competing
// for rows: each holds a fair share, claims only their rows, and puts the
// partition on each message. A stopping relay gives its partitions back,
// and one that vanishes loses them when its leases end.
func testRelaysSharePartitions(t *testing.T, mode Mode) {
	t.Parallel()
	b := Setup(t, mode)
	b.PollOnly("partition leases")
	b.BindQueue("observer", "#")
	cfg := Config()
	cfg.Partitions = 8
	// A relay that vanished holds partition 7 until its lease ends.
	if _, err := b.Pool.Exec(b.Ctx, `INSERT INTO outbox_partition_lease (partition_no, relay_id, lease_until) VALUES (7, 'ghost', now() + interval '3 seconds')`); err != nil {
		t.Fatal(err)
	}
	cfg.ID = "relay-a"
	a := b.StartRelay(cfg, b.AMQPURL, nil)
	cfg.ID = "relay-b"
	b.StartRelay(cfg, b.AMQPURL, nil)
	held := func(relay string) []int {
		var ps []int
		rows, err := b.Pool.Query(b.Ctx, `SELECT partition_no FROM outbox_partition_lease WHERE relay_id = $1 AND lease_until > now() ORDER BY 1`, relay)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		for rows.Next() {
			var p int
			if err := rows.Scan(&p); err != nil {
				t.Fatal(err)
			}
			ps = append(ps, p)
		}
		return ps
	}
	testenv.WaitFor(t, 20*time.Second, "the two relays to hold four partitions each, the ghost's included", func() bool {
		return len(held("relay-a")) == 4 && len(held("relay-b")) == 4
	})

	ids := b.Enqueue(200, messaging.Cause{})
	got := b.ReceiveEach("observer", ids, 30*time.Second)
	byRelay := map[string]int{}
	for _, d := range got {
		p, ok := d.Headers[outbox.HeaderPartition].(int32)
		if !ok || p < 0 || p >= 8 {
			t.Fatalf("message %s has partition header %v", d.MessageId, d.Headers[outbox.HeaderPartition])
		}
		owner := "relay-b"
		if slices.Contains(held("relay-a"), int(p)) {
			owner = "relay-a"
		}
		byRelay[owner]++
	}
	if byRelay["relay-a"] == 0 || byRelay["relay-b"] == 0 {
		t.Fatalf("published by partition owner: %v; want both relays to share the work", byRelay)
	}

	if err := a.Stop(); err != nil { // it gives its partitions back
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "relay-b to hold every partition", func() bool { return len(held("relay-b")) == 8 })
	more := b.Enqueue(50, messaging.Cause{})
	b.ReceiveEach("observer", more, 30*time.Second)
}

// receiveEach reads queue until it has seen every one of ids (a duplicate,
// which a late confirm or a lease that ran out under load may cause, is
// allowed), and returns what it read.
func (b *Bundle) ReceiveEach(queue string, ids []uuid.UUID, timeout time.Duration) []amqp.Delivery {
	b.T.Helper()
	want := map[string]bool{}
	for _, id := range ids {
		want[id.String()] = true
	}
	var got []amqp.Delivery
	deadline := time.Now().Add(timeout)
	for len(want) > 0 && time.Now().Before(deadline) {
		d, ok, err := b.Ch.Get(queue, true)
		if err != nil {
			b.T.Fatal(err)
		}
		if !ok {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		got = append(got, d)
		delete(want, d.MessageId)
	}
	if len(want) > 0 {
		b.T.Fatalf("%s: %d of %d messages never arrived", queue, len(want), len(ids))
	}
	return got
}

func uuidStrings(ids []uuid.UUID) []string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = id.String()
	}
	return out
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// Two transactions write messages of one aggregate, each after locking the
// aggregate's row (as a guarded update of an order does). The one that
// began first but waited for the lock commits second: its message must go
// out second. An outbox row is stamped when it is inserted, not when its
// transaction began (migrations/00003_insert_time.sql), so commit order is publish order.
func testAnAggregatesMessagesGoOutInTheOrderTheyCommitted(t *testing.T, mode Mode) {
	t.Parallel()
	b := Setup(t, mode)
	b.BindQueue("observer", "#")
	aggregate := uuid.New()
	if _, err := b.Pool.Exec(b.Ctx, `CREATE TABLE test_aggregate (id uuid PRIMARY KEY, version int NOT NULL);
		INSERT INTO test_aggregate VALUES ('`+aggregate.String()+`', 0)`); err != nil {
		t.Fatal(err)
	}
	write := func(tx pgx.Tx, typ string) string {
		if _, err := tx.Exec(b.Ctx, `UPDATE test_aggregate SET version = version + 1 WHERE id = $1`, aggregate); err != nil {
			t.Fatal(err)
		}
		ids, err := Writer.Write(b.Ctx, tx, messaging.Cause{}, Message{Type: typ, ID: aggregate})
		if err != nil {
			t.Fatal(err)
		}
		return ids[0].String()
	}
	late, err := b.Pool.Begin(b.Ctx) // begins first...
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = late.Rollback(b.Ctx) }()
	if _, err := late.Exec(b.Ctx, "SELECT now()"); err != nil { // ...and takes its snapshot and start time now
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	early, err := b.Pool.Begin(b.Ctx)
	if err != nil {
		t.Fatal(err)
	}
	first := write(early, TypeSubmitted) // locks the aggregate, writes, commits
	if err := early.Commit(b.Ctx); err != nil {
		t.Fatal(err)
	}
	second := write(late, TypeCancelled) // the lock is free now
	if err := late.Commit(b.Ctx); err != nil {
		t.Fatal(err)
	}
	b.StartRelay(Config(), b.AMQPURL, nil)
	if got := arrivalOrder(b.Receive("observer", 2, 15*time.Second, 0)); !slices.Equal(got, []string{first, second}) {
		t.Fatalf("published %v, want %v: the order they committed in", got, []string{first, second})
	}
}

// arrivalOrder lists the message ids of ds in the order they arrived
// (messageIDs sorts them).
func arrivalOrder(ds []amqp.Delivery) []string {
	ids := make([]string, len(ds))
	for i, d := range ds {
		ids[i] = d.MessageId
	}
	return ids
}

// A relay that joins while another holds every partition gets its fair
// share: it counts as present from its first turn, before it holds
// anything, so the holder gives back what is above its share. (Counting
// only the relays that held a lease, the holder's share stayed all of them
// and the newcomer never got one.)
func testARelayThatJoinsLaterGetsItsShare(t *testing.T, mode Mode) {
	t.Parallel()
	b := Setup(t, mode)
	b.PollOnly("partition leases")
	cfg := Config()
	cfg.Partitions = 8
	held := func(relay string) int {
		var n int
		if err := b.Pool.QueryRow(b.Ctx, `SELECT count(*) FROM outbox_partition_lease WHERE relay_id = $1 AND lease_until > now()`, relay).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	cfg.ID = "relay-a"
	b.StartRelay(cfg, b.AMQPURL, nil)
	testenv.WaitFor(t, 20*time.Second, "the first relay to hold every partition", func() bool { return held("relay-a") == 8 })
	cfg.ID = "relay-b"
	b.StartRelay(cfg, b.AMQPURL, nil)
	testenv.WaitFor(t, 20*time.Second, "the two relays to hold four partitions each", func() bool {
		return held("relay-a") == 4 && held("relay-b") == 4
	})

	// A third joins, through a proxy to the database that can freeze it:
	// within a lease period each of the three holds at least 2 (3, 3, 2),
	// and keeps them, sampled at every poll for a few seconds.
	proxy := testenv.NewProxy(t, testenv.HostPort(b.DBURL))
	direct := b.DBURL
	b.DBURL = proxy.Rewrite(direct)
	cfg.ID = "relay-c"
	b.StartRelay(cfg, b.AMQPURL, nil)
	b.DBURL = direct
	shares := func() (a, bb, c int) { return held("relay-a"), held("relay-b"), held("relay-c") }
	testenv.WaitFor(t, cfg.Lease+5*time.Second, "three relays to hold at least two partitions each", func() bool {
		a, bb, c := shares()
		return min(a, bb, c) >= 2 && a+bb+c == 8
	})
	for range 20 {
		if a, bb, c := shares(); min(a, bb, c) < 2 || a+bb+c != 8 {
			t.Fatalf("shares of three relays: %d, %d, %d; want each at least 2 of 8", a, bb, c)
		}
		time.Sleep(cfg.PollInterval)
	}

	// relay-c freezes (its database is cut off): its leases run out and
	// the two others share its partitions, four each.
	proxy.Cut()
	testenv.WaitFor(t, cfg.Lease+5*time.Second, "the two live relays to take the frozen one's partitions", func() bool {
		a, bb, _ := shares()
		return a == 4 && bb == 4
	})
	// It comes back, and gets its share again.
	proxy.Restore()
	testenv.WaitFor(t, cfg.Lease+5*time.Second, "the thawed relay to get its share back", func() bool {
		a, bb, c := shares()
		return min(a, bb, c) >= 2 && a+bb+c == 8
	})
}
