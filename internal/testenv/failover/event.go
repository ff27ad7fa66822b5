package failover

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/yourorg/orders/internal/testenv"
)

// Kind is how a failover happens.
type Kind string

// The kinds of failover.
const (
	// Kill kills the leader as a machine dies (kill -9 of Patroni and
	// PostgreSQL); the standby takes over when the leader key expires,
	// and the killed node is started again and rejoins as its standby.
	Kill Kind = "kill"
	// Switchover hands the leadership to the standby, as an operator does
	// before maintenance: the leader shuts down cleanly and comes back as
	// the standby.
	Switchover Kind = "switchover"
)

// KindOf is the kind of the i-th failover of a campaign (from 0): a kill,
// then a switchover, in turn.
func KindOf(i int) Kind {
	if i%2 == 0 {
		return Kill
	}
	return Switchover
}

// Event is one failover.
type Event struct {
	Kind     Kind
	From, To string // the old leader's and the new one's node names
	// At is the kill, or the switchover's request.
	At time.Time
	// Writable is when the new leader was first seen taking writes (its
	// PostgreSQL out of recovery, polled every 50 ms): the end of the
	// failover for the clients.
	Writable time.Time
	// Whole is when the old leader was back as the synchronous standby.
	Whole time.Time
}

// Failover fails c over as kind says, and returns once the cluster is
// whole again: a leader and its synchronous standby.
func Failover(t testing.TB, c *testenv.PatroniCluster, kind Kind) Event {
	t.Helper()
	if kind == Kill {
		killed := c.KillLeader(t)
		ev := Event{Kind: kind, From: killed.Name, At: time.Now()}
		leader, writable := c.WaitWritable(t, killed)
		ev.To, ev.Writable = leader.Name, writable
		killed.Start(t)
		c.WaitHealthy(t, 3*time.Minute)
		ev.Whole = time.Now()
		return ev
	}
	old := c.Leader(t)
	ev := Event{Kind: kind, From: old.Name, At: time.Now()}
	writable := watchWritable(c, old)
	ev.To = c.Switchover(t).Name
	ev.Whole = time.Now()
	if ev.Writable = writable(); ev.Writable.IsZero() {
		ev.Writable = ev.Whole // not seen while it happened: at the latest
	}
	return ev
}

// watchWritable polls, every 50 ms, the nodes other than old until one
// takes writes, and returns a function that stops the polling and says
// when that was first seen (zero: not yet).
func watchWritable(c *testenv.PatroniCluster, old *testenv.PatroniNode) func() time.Time {
	var seen time.Time
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			for _, n := range c.Nodes {
				if n != old && n.Writable() {
					seen = time.Now()
					return
				}
			}
			select {
			case <-done:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	})
	return func() time.Time {
		close(done)
		wg.Wait()
		return seen
	}
}

// WaitSlotOnStandbys waits until every running standby of c has the
// relay's replication slot, which Patroni copies there from the leader
// (restarting the standby's PostgreSQL to do so), and the cluster is
// healthy again: only then does a new primary have it. It returns how
// long that took.
func WaitSlotOnStandbys(t testing.TB, c *testenv.PatroniCluster) time.Duration {
	t.Helper()
	started := time.Now()
	leader := c.Leader(t)
	for _, n := range c.Nodes {
		if n == leader || !n.Running() {
			continue
		}
		testenv.WaitFor(t, 2*time.Minute, "Patroni to copy replication slot "+Slot+" to "+n.Name, func() bool {
			return hasSlot(n)
		})
	}
	c.WaitHealthy(t, 2*time.Minute)
	return time.Since(started)
}

// hasSlot says whether node's PostgreSQL has the relay's slot.
func hasSlot(n *testenv.PatroniNode) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, n.URL("postgres"))
	if err != nil {
		return false
	}
	defer func() { _ = conn.Close(context.Background()) }()
	var ok bool
	return conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1)", Slot).Scan(&ok) == nil && ok
}

// steady is how long the load runs on a whole cluster before each
// failover, and after the last.
const steady = 4 * time.Second

// Campaign fails c over n times while ld places orders, a kill and a
// switchover in turn (KindOf). Before each failover the cluster is whole,
// and for WAL the standby has the relay's slot (WaitSlotOnStandbys), then
// the load runs steady for some seconds; after each, it waits for an
// order answered 201 by the new leader. It logs each failover as it goes.
func Campaign(t testing.TB, c *testenv.PatroniCluster, mode Mode, ld *Load, n int) []Event {
	t.Helper()
	events := make([]Event, 0, n)
	for i := range n {
		if mode == WAL {
			if d := WaitSlotOnStandbys(t, c); d > time.Second {
				t.Logf("failover %d: waited %s for the standby to have slot %s", i+1, d.Round(100*time.Millisecond), Slot)
			}
		}
		time.Sleep(steady)
		ev := Failover(t, c, KindOf(i))
		testenv.WaitFor(t, 2*time.Minute, "an order answered 201 after the failover", func() bool { return ld.AnsweredAfter(ev.Writable) })
		t.Logf("failover %d, %s: %s -> %s at %s; the new leader took writes %s after, the cluster whole %s after",
			i+1, ev.Kind, ev.From, ev.To, ev.At.Format(clock), ev.Writable.Sub(ev.At).Round(100*time.Millisecond),
			ev.Whole.Sub(ev.At).Round(100*time.Millisecond))
		events = append(events, ev)
	}
	time.Sleep(steady)
	return events
}
