package testenv_test

import (
	"encoding/json"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/yourorg/orders/internal/testenv"
)

// The cluster fixture: three nodes of their own, joined; a quorum queue
// declared through any of them has a replica on each; killing its
// leader's Erlang VM elects another leader and loses no confirmed
// message; the node comes back and rejoins.
func TestRabbitCluster(t *testing.T) {
	t.Parallel()
	c := testenv.NewRabbitCluster(t)

	var status struct {
		RunningNodes []string `json:"running_nodes"`
		DiskNodes    []string `json:"disk_nodes"`
	}
	out := c.Nodes[2].Ctl(t, "cluster_status", "--formatter", "json")
	if err := json.Unmarshal([]byte(out), &status); err != nil {
		t.Fatalf("cluster_status: %v: %s", err, out)
	}
	var names []string
	for _, n := range c.Nodes {
		names = append(names, n.Name)
		if !strings.HasPrefix(n.Name, "rabbit-") || n.Addr == "127.0.0.1:5672" {
			t.Errorf("node %s at %s: the fixture's nodes have names and ports of their own", n.Name, n.Addr)
		}
	}
	slices.Sort(names)
	slices.Sort(status.RunningNodes)
	if !slices.Equal(status.RunningNodes, names) {
		t.Fatalf("running nodes %v, want %v", status.RunningNodes, names)
	}

	url := c.NewVhost(t)
	if got := len(strings.Split(url, ",")); got != 3 {
		t.Fatalf("NewVhost URL %s has %d addresses, want 3", url, got)
	}
	conn, err := amqp.Dial(c.Nodes[1].URL(t, url))
	if err != nil {
		t.Fatal(err)
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare("q", true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	dc, err := ch.PublishWithDeferredConfirm("", "q", true, false, amqp.Publishing{Body: []byte("kept")})
	if err != nil || !dc.Wait() {
		t.Fatalf("publish: %v, confirmed %v", err, dc != nil && dc.Acked())
	}
	_ = conn.Close()

	q := c.Queue(t, url, "q")
	if len(q.Members) != 3 || len(q.Online) != 3 {
		t.Fatalf("queue q: members %v, online %v; want all three nodes", q.Members, q.Online)
	}
	leader := c.Leader(t, url, "q")

	// kill -9 of the leader's Erlang VM.
	pid := leader.PID()
	if comm, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm"); err == nil && strings.TrimSpace(string(comm)) != "beam.smp" {
		t.Fatalf("node %s: process %d is %q, not the Erlang VM", leader.Name, pid, comm)
	}
	killed := time.Now()
	leader.Kill(t)
	next := c.Leader(t, url, "q")
	if next == leader {
		t.Fatalf("%s still leads q after its kill", leader.Name)
	}
	t.Logf("killed %s, the leader of q; %s leads it %s later", leader.Name, next.Name, time.Since(killed).Round(time.Millisecond))

	// The confirmed message survived the leader.
	conn, err = amqp.Dial(next.URL(t, url))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err = conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	d, ok, err := ch.Get("q", true)
	if err != nil || !ok || string(d.Body) != "kept" {
		t.Fatalf("get from q after the leader died: %q, %v, %v; want the confirmed message", d.Body, ok, err)
	}

	restarted := time.Now()
	leader.Start(t)
	t.Logf("%s back in %s", leader.Name, time.Since(restarted).Round(time.Millisecond))
	c.AwaitQueue(t, url, "q", leader.Name+" to be an online member of q again", func(q testenv.QuorumQueue) bool {
		return slices.Contains(q.Online, leader.Name)
	})
}
