package testenv

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/yourorg/orders/internal/rabbitadmin"
)

// RabbitCluster is a RabbitMQ cluster of three nodes on this machine, for
// the tests of what a client sees when a node dies: the rabbitmq-server
// installed here, run three times under node names, ports and data
// directories of the test's own (rabbit-<id>-1@localhost, ..., every file
// under a temporary directory), sharing an Erlang cookie of their own,
// joined with rabbitmqctl (stop_app, join_cluster, start_app). It never
// touches the shared broker (rabbit@localhost, port 5672): every
// rabbitmqctl call names one of its own nodes.
//
// Starting takes a while (15 to 45 seconds here, most of it three Erlang
// VMs booting side by side on two busy cores; t.Log says how long), so
// tests that can share a cluster run as subtests of the test that started
// it, each with its own vhost and user (NewVhost); a test that kills nodes
// needs a cluster of its own. Every node is killed when the test ends,
// and, on Linux, when the test binary dies (a panic, a timeout).
type RabbitCluster struct {
	Nodes []*RabbitNode
	// StartedIn is how long the cluster took to start: BootedIn for the
	// three nodes to boot, side by side, the rest for the joins.
	StartedIn, BootedIn time.Duration

	id     string
	dir    string
	bin    string   // the directory of rabbitmq-server and rabbitmqctl
	env    []string // the environment of every node and rabbitmqctl call
	logf   func(string, ...any)
	closed bool
}

// RabbitNode is one node of a RabbitCluster.
type RabbitNode struct {
	// Name is the Erlang node name, rabbit-<id>-<n>@localhost.
	Name string
	// Addr is its AMQP listener, 127.0.0.1:<port>.
	Addr string

	cluster *RabbitCluster
	dir     string
	env     []string // its own variables, after the cluster's

	mu      sync.Mutex
	cmd     *exec.Cmd     // the running beam.smp, nil when down
	exited  chan struct{} // closed when cmd has exited
	started time.Time
}

// The time limits of the fixture: a node boots in seconds on a quiet
// machine (about 4 CPU seconds), but three of them booting beside other
// test suites on two cores have taken three minutes.
const (
	clusterNodeStartTimeout = 5 * time.Minute
	clusterCtlTimeout       = 2 * time.Minute
	// clusterPoll spaces the rabbitmqctl calls of a wait: each call starts
	// an Erlang VM, half a CPU second, which a busy machine feels.
	clusterPoll = time.Second
)

// NewRabbitCluster starts a cluster of three nodes for t, and stops it when
// t ends. Without rabbitmq-server on this machine (or under -short) t is
// skipped, saying so.
func NewRabbitCluster(t testing.TB) *RabbitCluster {
	t.Helper()
	needsServers(t, "RabbitMQ")
	bin, err := rabbitmqScripts()
	if err != nil {
		t.Skipf("testenv: a RabbitMQ cluster needs rabbitmq-server installed on this machine: %v", err)
	}
	c := &RabbitCluster{id: randomSuffix()[:8], dir: t.TempDir(), bin: bin, logf: t.Logf}
	t.Cleanup(func() { c.close(t) })
	if err := c.start(t, 3); err != nil {
		t.Fatalf("testenv: start a RabbitMQ cluster: %v", err)
	}
	t.Logf("testenv: RabbitMQ cluster %s up in %s (booted in %s, then joined): %s", c.id,
		c.StartedIn.Round(100*time.Millisecond), c.BootedIn.Round(100*time.Millisecond), c.describe())
	return c
}

// rabbitmqScripts finds the directory of the RabbitMQ scripts. On Debian
// and Ubuntu, rabbitmq-server on the PATH is a wrapper that runs the real
// script as the rabbitmq user, with that user's cookie; the real scripts
// are beside it.
func rabbitmqScripts() (string, error) {
	path, err := exec.LookPath("rabbitmq-server")
	if err != nil {
		return "", err
	}
	if path, err = filepath.EvalSymlinks(path); err != nil {
		return "", err
	}
	dir := filepath.Dir(path)
	for _, script := range []string{"rabbitmq-server", "rabbitmqctl"} {
		if _, err := os.Stat(filepath.Join(dir, script)); err != nil {
			return "", fmt.Errorf("%s has no %s beside it", path, script)
		}
	}
	return dir, nil
}

func (c *RabbitCluster) start(t testing.TB, n int) error {
	ctx := t.Context()
	started := time.Now()
	home := filepath.Join(c.dir, "home")
	if err := os.MkdirAll(home, 0o700); err != nil {
		return err
	}
	// The nodes' shared secret: a cookie of this cluster, not the shared
	// broker's. Erlang reads it from $HOME, for the nodes and rabbitmqctl.
	if err := os.WriteFile(filepath.Join(home, ".erlang.cookie"), []byte(strings.ToUpper(rand.Text())), 0o400); err != nil {
		return err
	}
	files := map[string]string{
		"rabbitmq-env.conf": "", // instead of /etc/rabbitmq's, which names the shared node
		"enabled_plugins":   "[].\n",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(c.dir, name), []byte(content), 0o600); err != nil {
			return err
		}
	}
	c.env = append(withoutRabbitMQVariables(os.Environ()),
		"HOME="+home,
		"RABBITMQ_CONF_ENV_FILE="+filepath.Join(c.dir, "rabbitmq-env.conf"),
		"RABBITMQ_ENABLED_PLUGINS_FILE="+filepath.Join(c.dir, "enabled_plugins"),
		"RABBITMQ_ADVANCED_CONFIG_FILE="+filepath.Join(c.dir, "advanced.config"), // none
		"ERL_EPMD_ADDRESS=127.0.0.1", // if this cluster is the one to start epmd
	)
	for i := 1; i <= n; i++ {
		node := &RabbitNode{
			Name:    fmt.Sprintf("rabbit-%s-%d@localhost", c.id, i),
			Addr:    FreeAddr(t),
			cluster: c,
			dir:     filepath.Join(c.dir, fmt.Sprint("node-", i)),
		}
		// The ports stay the node's across restarts: its clients' URLs
		// name them.
		_, distPort, _ := net.SplitHostPort(FreeAddr(t))
		_, port, _ := net.SplitHostPort(node.Addr)
		conf := fmt.Sprintf("# Node %d of a test cluster (internal/testenv/cluster.go).\n"+
			"listeners.tcp.1 = 127.0.0.1:%s\n"+
			// What production clusters of three nodes set: a node cut off
			// from the other two pauses rather than serving a split brain.
			"cluster_partition_handling = pause_minority\n", i, port)
		if err := os.MkdirAll(node.dir, 0o700); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(node.dir, "rabbitmq.conf"), []byte(conf), 0o600); err != nil {
			return err
		}
		node.env = []string{
			"RABBITMQ_NODENAME=" + node.Name,
			"RABBITMQ_DIST_PORT=" + distPort,
			"RABBITMQ_CONFIG_FILE=" + filepath.Join(node.dir, "rabbitmq.conf"),
			"RABBITMQ_MNESIA_BASE=" + filepath.Join(node.dir, "mnesia"),
			"RABBITMQ_LOG_BASE=" + filepath.Join(node.dir, "log"),
			// The script execs the Erlang VM in its own process rather than
			// running it as a child (what it does to translate signals when
			// there is no input): the process this package starts is the
			// node's beam.smp, which a kill -9 kills and which dies with the
			// test binary. -noinput keeps the Erlang shell off all the same.
			"RABBITMQ_ALLOW_INPUT=true",
			"RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=-noinput -kernel inet_dist_use_interface {127,0,0,1}",
		}
		c.Nodes = append(c.Nodes, node)
	}

	// The nodes boot side by side, then join the first one by one.
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, node := range c.Nodes {
		wg.Go(func() { errs[i] = node.boot(ctx) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	c.BootedIn = time.Since(started)
	first := c.Nodes[0]
	for _, node := range c.Nodes[1:] {
		for _, args := range [][]string{{"stop_app"}, {"join_cluster", first.Name}, {"start_app"}} {
			if _, err := node.ctl(ctx, args...); err != nil {
				return fmt.Errorf("join %s to %s: %w", node.Name, first.Name, err)
			}
		}
	}
	c.StartedIn = time.Since(started)
	return nil
}

// withoutRabbitMQVariables drops the variables of environ that would point
// a node or rabbitmqctl elsewhere (another node name, config, cookie).
func withoutRabbitMQVariables(environ []string) []string {
	return slices.DeleteFunc(slices.Clone(environ), func(kv string) bool {
		name, _, _ := strings.Cut(kv, "=")
		return strings.HasPrefix(name, "RABBITMQ_") || strings.HasPrefix(name, "ERL_") || name == "HOME"
	})
}

func (c *RabbitCluster) describe() string {
	var parts []string
	for _, n := range c.Nodes {
		parts = append(parts, n.Name+" "+n.Addr)
	}
	return strings.Join(parts, ", ")
}

// close kills every node; when t failed, it logs the end of each node's
// log first.
func (c *RabbitCluster) close(t testing.TB) {
	c.closed = true
	for _, n := range c.Nodes {
		n.kill()
	}
	if t.Failed() {
		for _, n := range c.Nodes {
			logs, _ := filepath.Glob(filepath.Join(n.dir, "log", "*.log"))
			for _, l := range logs {
				if b, err := os.ReadFile(l); err == nil {
					t.Logf("--- %s (last 3 KiB):\n%s", l, tail3k(b))
				}
			}
		}
	}
}

func tail3k(b []byte) []byte {
	if len(b) > 3072 {
		return b[len(b)-3072:]
	}
	return b
}

// boot starts the node's process and waits until its AMQP listener
// accepts connections (the last step of a RabbitMQ boot but the plugins',
// of which these nodes have none).
func (n *RabbitNode) boot(ctx context.Context) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd != nil {
		return fmt.Errorf("%s is running already", n.Name)
	}
	// The node lives until Kill or the cluster's cleanup, not as long as a
	// context: a subtest that restarts it must not take it down when it ends.
	cmd := exec.CommandContext(context.WithoutCancel(ctx), filepath.Join(n.cluster.bin, "rabbitmq-server"))
	cmd.Env = append(slices.Clone(n.cluster.env), n.env...)
	cmd.Dir = n.dir
	out, err := os.OpenFile(filepath.Join(n.dir, "stdout.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer func() { _ = out.Close() }() // the node has its own descriptor
	cmd.Stdout, cmd.Stderr = out, out
	if err := startTiedToTest(cmd); err != nil {
		return fmt.Errorf("start %s: %w", n.Name, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	n.cmd, n.exited, n.started = cmd, exited, time.Now()

	deadline := time.Now().Add(clusterNodeStartTimeout)
	for {
		conn, err := (&net.Dialer{Timeout: time.Second}).DialContext(ctx, "tcp", n.Addr)
		if err == nil {
			_ = conn.Close()
			return nil
		}
		select {
		case <-exited:
			n.cmd = nil
			b, _ := os.ReadFile(filepath.Join(n.dir, "stdout.log"))
			return fmt.Errorf("%s exited while starting: %s", n.Name, tail3k(b))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not listen on %s within %s", n.Name, n.Addr, clusterNodeStartTimeout)
		}
	}
}

// kill kills the node's process (SIGKILL) and waits until it has exited.
// A node that is down stays down.
func (n *RabbitNode) kill() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return
	}
	_ = n.cmd.Process.Kill()
	<-n.exited
	n.cmd = nil
}

// Kill kills the node at once, as a crash or a power cut would: kill -9 of
// its Erlang VM (beam.smp). Its clients' connections drop; the other two
// nodes see it go and elect new leaders for the quorum queues it led.
func (n *RabbitNode) Kill(t testing.TB) {
	t.Helper()
	n.mu.Lock()
	running := n.cmd != nil
	n.mu.Unlock()
	if !running {
		t.Fatalf("testenv: kill %s: it is not running", n.Name)
	}
	n.kill()
}

// Start starts the node again after Kill, on its data directory: it
// rejoins the cluster, and its quorum queue members catch up from the
// others. It returns when the node takes connections again.
func (n *RabbitNode) Start(t testing.TB) {
	t.Helper()
	if err := n.boot(t.Context()); err != nil {
		t.Fatalf("testenv: restart %s: %v", n.Name, err)
	}
	if _, err := n.ctl(t.Context(), "await_startup"); err != nil {
		t.Fatalf("testenv: restart %s: %v", n.Name, err)
	}
}

// Running reports whether the node's process is running.
func (n *RabbitNode) Running() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.cmd != nil
}

// PID is the process id of the node's Erlang VM (beam.smp), 0 when down.
func (n *RabbitNode) PID() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return 0
	}
	return n.cmd.Process.Pid
}

// URL returns the URL of this node alone out of a cluster URL (a list
// NewVhost returned).
func (n *RabbitNode) URL(t testing.TB, clusterURL string) string {
	t.Helper()
	for u := range strings.SplitSeq(clusterURL, ",") {
		if HostPort(u) == n.Addr {
			return u
		}
	}
	t.Fatalf("testenv: %s is not in %s", n.Addr, clusterURL)
	return ""
}

// Ctl runs rabbitmqctl against this node (rabbitmqctl -n <node> -q args...)
// and returns what it printed, failing t when it fails.
func (n *RabbitNode) Ctl(t testing.TB, args ...string) string {
	t.Helper()
	out, err := n.ctl(t.Context(), args...)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	return out
}

func (n *RabbitNode) ctl(ctx context.Context, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, clusterCtlTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(n.cluster.bin, "rabbitmqctl"), append([]string{"-n", n.Name, "-q"}, args...)...)
	cmd.Env = n.cluster.env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("rabbitmqctl -n %s %s: %w: %s", n.Name, args[0], err, strings.TrimSpace(out.String()))
	}
	return out.String(), nil
}

// Running returns the nodes whose process runs.
func (c *RabbitCluster) Running() []*RabbitNode {
	return slices.DeleteFunc(slices.Clone(c.Nodes), func(n *RabbitNode) bool { return !n.Running() })
}

// Node returns the node called name (an Erlang node name).
func (c *RabbitCluster) Node(name string) *RabbitNode {
	for _, n := range c.Nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// Ctl runs rabbitmqctl against a running node, as RabbitNode.Ctl does.
func (c *RabbitCluster) Ctl(t testing.TB, args ...string) string {
	t.Helper()
	running := c.Running()
	if len(running) == 0 {
		t.Fatal("testenv: no node of the cluster is running")
	}
	return running[0].Ctl(t, args...)
}

// NewVhost creates a vhost and a user with every permission in it, for t
// alone, and returns the AMQP URL list that reaches it through every node
// (amqp://user:password@127.0.0.1:<port1>/<vhost>,...: AMQP_URL for a
// process of the service). Both are deleted when t ends, if the cluster
// still runs.
func (c *RabbitCluster) NewVhost(t testing.TB) string {
	t.Helper()
	name := testVhostPrefix + randomSuffix()
	password := rand.Text()
	defs := map[string]any{
		"vhosts": []map[string]any{{"name": name}},
		"users": []map[string]any{{"name": name, "password_hash": rabbitadmin.HashPassword(password),
			"hashing_algorithm": rabbitadmin.HashingAlgorithm, "tags": []string{}}},
		"permissions": []map[string]any{{"user": name, "vhost": name, "configure": ".*", "write": ".*", "read": ".*"}},
	}
	file := filepath.Join(c.dir, name+".json")
	b, _ := json.Marshal(defs)
	if err := os.WriteFile(file, b, 0o600); err != nil {
		t.Fatal(err)
	}
	// One call creates all three: a rabbitmqctl call costs a second.
	c.Ctl(t, "import_definitions", file)
	t.Cleanup(func() {
		if c.closed || len(c.Running()) == 0 {
			return
		}
		n := c.Running()[0]
		for _, args := range [][]string{{"delete_vhost", name}, {"delete_user", name}} {
			if _, err := n.ctl(context.Background(), args...); err != nil {
				t.Errorf("testenv: %v", err)
			}
		}
	})
	urls := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		u := url.URL{Scheme: "amqp", User: url.UserPassword(name, password), Host: n.Addr, Path: "/" + name}
		urls[i] = u.String()
	}
	return strings.Join(urls, ",")
}

// Vhost returns the vhost of a cluster URL list.
func vhostOf(clusterURL string) string {
	first, _, _ := strings.Cut(clusterURL, ",")
	u, err := url.Parse(first)
	if err != nil {
		return ""
	}
	return strings.TrimPrefix(u.Path, "/")
}

// QuorumQueue is what the cluster says of a quorum queue.
type QuorumQueue struct {
	Name    string
	Leader  string   // the node name of its leader ("" while it has none)
	Members []string // the nodes holding a replica
	Online  []string // the members that are running
	// Messages is its depth: ready and unacknowledged.
	Messages int
}

// Queues lists the quorum queues of the vhost of clusterURL, with their
// leader and members, as a running node sees them.
func (c *RabbitCluster) Queues(t testing.TB, clusterURL string) []QuorumQueue {
	t.Helper()
	out := c.Ctl(t, "list_queues", "-p", vhostOf(clusterURL), "name", "type", "leader", "members", "online", "messages", "--formatter", "json")
	var rows []struct {
		Name     string `json:"name"`
		Type     string `json:"type"`
		Leader   any    `json:"leader"`
		Members  any    `json:"members"`
		Online   any    `json:"online"`
		Messages any    `json:"messages"`
	}
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		t.Fatalf("testenv: list_queues: %v: %s", err, out)
	}
	var qs []QuorumQueue
	for _, r := range rows {
		if r.Type != "quorum" {
			continue
		}
		messages, _ := r.Messages.(float64) // "" while the queue has no leader
		qs = append(qs, QuorumQueue{Name: r.Name, Leader: nodeName(r.Leader), Members: nodeNames(r.Members), Online: nodeNames(r.Online),
			Messages: int(messages)})
	}
	return qs
}

// Queue returns what the cluster says of the quorum queue called name.
func (c *RabbitCluster) Queue(t testing.TB, clusterURL, name string) QuorumQueue {
	t.Helper()
	q, ok := c.findQueue(t, clusterURL, name)
	if !ok {
		t.Fatalf("testenv: no quorum queue %s in vhost %s", name, vhostOf(clusterURL))
	}
	return q
}

// findQueue is Queue that says when the cluster does not list the queue.
func (c *RabbitCluster) findQueue(t testing.TB, clusterURL, name string) (QuorumQueue, bool) {
	t.Helper()
	for _, q := range c.Queues(t, clusterURL) {
		if q.Name == name {
			return q, true
		}
	}
	return QuorumQueue{}, false
}

// AwaitQueue reads the quorum queue called name every second until cond
// holds, and returns what it read last; after two minutes it fails t,
// saying what it waited for.
func (c *RabbitCluster) AwaitQueue(t testing.TB, clusterURL, name, what string, cond func(QuorumQueue) bool) QuorumQueue {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		// Right after a node dies, list_queues can leave out a queue it
		// led: not yet, rather than gone.
		q, listed := c.findQueue(t, clusterURL, name)
		if listed && cond(q) {
			return q
		}
		if time.Now().After(deadline) {
			t.Fatalf("testenv: timed out waiting for %s: queue %s has leader %q, members %v, online %v", what, name, q.Leader, q.Members, q.Online)
		}
		time.Sleep(clusterPoll)
	}
}

// Leader returns the node that leads the quorum queue called name, waiting
// while an election is under way.
func (c *RabbitCluster) Leader(t testing.TB, clusterURL, name string) *RabbitNode {
	t.Helper()
	q := c.AwaitQueue(t, clusterURL, name, "a leader of "+name, func(q QuorumQueue) bool {
		n := c.Node(q.Leader)
		return n != nil && n.Running()
	})
	return c.Node(q.Leader)
}

// nodeName and nodeNames read the leader, members and online columns of
// list_queues' JSON: a node name, a list of them, or "" for none.
func nodeName(v any) string {
	s, _ := v.(string)
	return s
}

func nodeNames(v any) []string {
	list, _ := v.([]any)
	var names []string
	for _, x := range list {
		if s, ok := x.(string); ok {
			names = append(names, s)
		}
	}
	slices.Sort(names)
	return names
}
