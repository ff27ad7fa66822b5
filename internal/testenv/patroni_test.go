package testenv_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/yourorg/orders/internal/testenv"
)

// The Patroni fixture: a leader and a synchronous standby; a client on the
// nodes' multi-host URL writes, the leader is killed (kill -9 of Patroni
// and PostgreSQL), the standby takes over and the same client writes
// again, with every row acknowledged before the kill still there; the old
// leader comes back as a standby of the new one, and a switchover makes
// it the leader again. Nothing of the cluster is left running after
// Close. wal_level is logical, and a permanent logical slot is on the
// leader, the first and the new one.
func TestPatroniCluster(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := testenv.NewPatroniCluster(t, testenv.PatroniOptions{
		WALLevel:       "logical",
		PermanentSlots: map[string]testenv.PatroniSlot{"fixture_slot": {Type: "logical", Database: "postgres", Plugin: "pgoutput"}},
	})
	if len(c.Nodes) != 2 || c.Nodes[0].Addr == c.Nodes[1].Addr || strings.Contains(c.URL("postgres"), ":5432") {
		t.Fatalf("nodes %+v, URL %s: want two nodes on ports of their own", c.Nodes, c.URL("postgres"))
	}
	first := c.Leader(t)

	pool, err := pgxpool.New(ctx, c.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pool.Exec(ctx, "CREATE TABLE fixture (n int PRIMARY KEY, written_on text NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	insert := func(n int) error {
		_, err := pool.Exec(ctx, "INSERT INTO fixture VALUES ($1, host(inet_server_addr()) || ':' || current_setting('port'))", n)
		return err
	}
	var walLevel string
	if err := pool.QueryRow(ctx, "SELECT current_setting('wal_level')").Scan(&walLevel); err != nil || walLevel != "logical" {
		t.Errorf("wal_level %q (%v), want logical", walLevel, err)
	}
	testenv.WaitFor(t, 30*time.Second, "Patroni to create the permanent slot on the leader", func() bool {
		var n int
		_ = pool.QueryRow(ctx, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'fixture_slot' AND plugin = 'pgoutput'").Scan(&n)
		return n == 1
	})
	const before = 50
	for n := range before {
		if err := insert(n); err != nil {
			t.Fatalf("insert %d on %s: %v", n, first.Name, err)
		}
	}

	// The leader dies; the same pool writes again once the standby leads.
	killed := c.KillLeader(t)
	at := time.Now()
	if killed != first {
		t.Fatalf("killed %s, the leader was %s", killed.Name, first.Name)
	}
	testenv.WaitFor(t, 90*time.Second, "a write through the multi-host URL after the leader's death", func() bool {
		return insert(before) == nil
	})
	t.Logf("writes resumed %s after the kill", time.Since(at).Round(100*time.Millisecond))
	second := c.Leader(t)
	if second == first {
		t.Fatalf("%s still leads after its death", first.Name)
	}
	// Patroni keeps the permanent slot on whichever node leads.
	testenv.WaitFor(t, 30*time.Second, "the permanent slot on the new leader", func() bool {
		var n int
		_ = pool.QueryRow(ctx, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'fixture_slot' AND plugin = 'pgoutput'").Scan(&n)
		return n == 1
	})
	var rows int
	var on string
	if err := pool.QueryRow(ctx, "SELECT count(*), max(written_on) FILTER (WHERE n = $1) FROM fixture", before).Scan(&rows, &on); err != nil {
		t.Fatal(err)
	}
	if rows != before+1 || on != second.Addr {
		t.Errorf("after the failover: %d rows, the last written on %s; want %d, on %s (synchronous: no acknowledged row lost)",
			rows, on, before+1, second.Addr)
	}

	// The old leader rejoins as the new one's standby, with every row.
	first.Start(t)
	c.WaitHealthy(t, 2*time.Minute)
	standby, err := pgx.Connect(ctx, first.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer standby.Close(ctx)
	var recovering bool
	if err := standby.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&recovering); err != nil || !recovering {
		t.Errorf("%s after its restart: in recovery %t (%v), want a standby", first.Name, recovering, err)
	}
	testenv.WaitFor(t, 30*time.Second, first.Name+" to have replayed every row", func() bool {
		var n int
		_ = standby.QueryRow(ctx, "SELECT count(*) FROM fixture").Scan(&n)
		return n == before+1
	})

	// A switchover hands the leadership back; the pool follows.
	if back := c.Switchover(t); back != first {
		t.Fatalf("the switchover made %s the leader, want %s", back.Name, first.Name)
	}
	testenv.WaitFor(t, 30*time.Second, "a write through the multi-host URL after the switchover", func() bool {
		return insert(before+1) == nil
	})
	if err := pool.QueryRow(ctx, "SELECT count(*), max(written_on) FILTER (WHERE n = $1) FROM fixture", before+1).Scan(&rows, &on); err != nil {
		t.Fatal(err)
	}
	if rows != before+2 || on != first.Addr {
		t.Errorf("after the switchover: %d rows, the last written on %s; want %d, on %s", rows, on, before+2, first.Addr)
	}

	// Close leaves no process of the cluster and no file.
	postmasters := []int{first.PostmasterPID(), second.PostmasterPID()}
	if postmasters[0] == 0 || postmasters[1] == 0 {
		t.Fatalf("postmaster pids %v: want both nodes running", postmasters)
	}
	pool.Close()
	c.Close()
	for _, pid := range postmasters {
		if running(pid) {
			t.Errorf("postmaster %d still runs after Close", pid)
		}
	}
	if _, err := os.Stat(c.Dir()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s after Close: %v, want it removed", c.Dir(), err)
	}
}

// running says whether process pid exists and is not a zombie (Linux's
// /proc: the fixture runs on Linux only).
func running(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(stat), ')')
	return i < 0 || !strings.HasPrefix(strings.TrimSpace(string(stat[i+1:])), "Z")
}
