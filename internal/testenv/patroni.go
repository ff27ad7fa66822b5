package testenv

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// PatroniCluster is a PostgreSQL 15 primary and a standby under Patroni,
// with an etcd of their own as the store Patroni elects the leader in
// (its etcd3 API): what production teams run, for the tests of what the
// service sees when the primary dies and the standby takes over. Every
// process runs from Debian's packages (patroni, etcd-server, and
// PostgreSQL's binaries in /usr/lib/postgresql/15/bin), on free ports of
// 127.0.0.1, with every file under a temporary directory; nothing of it
// is shared with the test server on port 5432.
//
// Patroni runs with short timings (a leader key that lives ten seconds,
// a loop of one second), so that the standby takes over within seconds
// of the primary's death rather than the half-minute of the defaults,
// and, unless PatroniOptions.Async, in synchronous mode: a commit the
// primary acknowledged is on the standby too, so a failover loses none.
//
// Every local connection is trusted, as on the shared test server, so a
// test connects as any role of migrations/00008_roles.sql without a
// password (AsRole of URL). When the test binary runs as root, Patroni and
// PostgreSQL run as the postgres user, which PostgreSQL requires.
//
// The cluster is t's: everything is killed and the directory removed when
// t ends (Close). Starting takes some seconds (t.Log says how long): the
// primary's initdb, then the standby's copy of it.
type PatroniCluster struct {
	Nodes []*PatroniNode
	// StartedIn is how long the cluster took to have a leader and a
	// streaming (synchronous) standby.
	StartedIn time.Duration

	t       testing.TB
	opts    PatroniOptions
	scope   string
	dir     string
	bin     string // PostgreSQL's binaries
	patroni string // the patroni executable

	etcdAddr string
	etcd     *exec.Cmd
	etcdDone chan struct{}

	uid, gid   uint32
	asPostgres bool

	closeOnce sync.Once
}

// PatroniOptions are what tests choose of a PatroniCluster.
type PatroniOptions struct {
	// Async runs the standby asynchronously (synchronous_mode false): a
	// failover may lose the commits the standby had not received.
	Async bool
	// WALLevel is the servers' wal_level: "replica" when empty, "logical"
	// for what reads the log through logical replication.
	WALLevel string
	// PermanentSlots are replication slots Patroni keeps on whichever
	// node is the leader (its permanent_slots), by name: a logical slot
	// survives a failover only this way.
	PermanentSlots map[string]PatroniSlot
}

// PatroniSlot is one of Patroni's permanent_slots: Type "logical" with
// the Database and output Plugin (pgoutput), or "physical".
type PatroniSlot struct {
	Type     string `json:"type"`
	Database string `json:"database,omitempty"`
	Plugin   string `json:"plugin,omitempty"`
}

// PatroniNode is one PostgreSQL server of a PatroniCluster and the Patroni
// that runs it.
type PatroniNode struct {
	// Name is the node's Patroni name, node1 or node2: PostgreSQL's
	// application_name for its replication connection too.
	Name string
	// Addr is PostgreSQL's address, 127.0.0.1:<port>.
	Addr string
	// APIURL is Patroni's REST API, http://127.0.0.1:<port>.
	APIURL string

	cluster *PatroniCluster
	dir     string
	data    string

	mu   sync.Mutex
	cmd  *exec.Cmd     // the running Patroni, nil when down
	done chan struct{} // closed when cmd has exited
}

// The fixture's timings. Patroni's: the leader key lives patroniTTL
// seconds; Patroni runs its loop every patroniLoopWait; a store or
// PostgreSQL that does not answer within patroniRetryTimeout does not
// demote the leader (Patroni wants loop_wait + 2 * retry_timeout within
// the ttl). The waits: a start is an initdb and a base backup, seconds
// on a quiet machine, minutes on a busy one.
const (
	patroniTTL          = 10
	patroniLoopWait     = 1
	patroniRetryTimeout = 3

	patroniStartTimeout = 3 * time.Minute
	// patroniFailoverTimeout bounds a failover: the leader key expires
	// within patroniTTL, then the standby promotes itself.
	patroniFailoverTimeout = 90 * time.Second
	patroniDirPrefix       = "orders-patroni-"
	// patroniLogsVariable, set to anything, makes Close log the end of
	// each node's log even when the test passed: how long each step of a
	// failover took, from Patroni's and PostgreSQL's side.
	patroniLogsVariable    = "TESTENV_PATRONI_LOGS"
	patroniPostgresVersion = "15"
)

// NewPatroniCluster starts etcd and two nodes for t, waits until one is
// the leader and the other streams from it (as its synchronous standby,
// unless opts.Async), and stops everything when t ends. Without Patroni,
// etcd or PostgreSQL 15 on this machine (or under -short) t is skipped,
// saying so: .ci/run installs them.
func NewPatroniCluster(t testing.TB, opts PatroniOptions) *PatroniCluster {
	t.Helper()
	needsServers(t, "a PostgreSQL cluster under Patroni")
	if opts.WALLevel == "" {
		opts.WALLevel = "replica"
	}
	c := &PatroniCluster{t: t, opts: opts, scope: "orders-test-" + randomSuffix()[:8],
		bin: filepath.Join("/usr/lib/postgresql", patroniPostgresVersion, "bin")}
	var missing []string
	var err error
	if c.patroni, err = exec.LookPath("patroni"); err != nil {
		missing = append(missing, "patroni")
	}
	if _, err := exec.LookPath("etcd"); err != nil {
		missing = append(missing, "etcd (etcd-server)")
	}
	if !isExecutable(filepath.Join(c.bin, "postgres")) {
		missing = append(missing, "PostgreSQL "+patroniPostgresVersion+" (postgresql-"+patroniPostgresVersion+")")
	}
	if len(missing) > 0 {
		t.Skipf("testenv: a Patroni cluster needs Debian's packages %s on this machine (.ci/run installs them)", strings.Join(missing, ", "))
	}
	if err := processesSupported(); err != nil {
		t.Skipf("testenv: a Patroni cluster: %v", err)
	}
	if c.uid, c.gid, c.asPostgres, err = postgresCredential(); err != nil {
		t.Fatal(err)
	}
	removePatroniLeftovers()
	if c.dir, err = os.MkdirTemp("", patroniDirPrefix+"*"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	if err := os.WriteFile(filepath.Join(c.dir, logicalOwnerFile), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := c.chown(c.dir); err != nil {
		t.Fatal(err)
	}

	started := time.Now()
	if err := c.startEtcd(); err != nil {
		t.Fatalf("testenv: start etcd: %v", err)
	}
	for i := 1; i <= 2; i++ {
		api := FreeAddr(t)
		n := &PatroniNode{Name: fmt.Sprint("node", i), Addr: FreeAddr(t), APIURL: "http://" + api,
			cluster: c, dir: filepath.Join(c.dir, fmt.Sprint("node", i))}
		n.data = filepath.Join(n.dir, "data")
		if err := os.Mkdir(n.dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := c.chown(n.dir); err != nil {
			t.Fatal(err)
		}
		if err := n.writeConfig(api); err != nil {
			t.Fatal(err)
		}
		c.Nodes = append(c.Nodes, n)
	}
	// Side by side: the first to take the store's initialize key runs
	// initdb, the other waits for it and copies it (pg_basebackup).
	for _, n := range c.Nodes {
		if err := n.start(); err != nil {
			t.Fatalf("testenv: start Patroni %s: %v", n.Name, err)
		}
	}
	c.WaitHealthy(t, patroniStartTimeout)
	c.StartedIn = time.Since(started)
	t.Logf("testenv: Patroni cluster %s up in %s: leader %s, %s", c.scope,
		c.StartedIn.Round(100*time.Millisecond), c.Leader(t).Name, c.describe())
	return c
}

func (c *PatroniCluster) chown(path string) error {
	if !c.asPostgres {
		return nil
	}
	return os.Chown(path, int(c.uid), int(c.gid))
}

// URL is a URL of database on the cluster as the superuser, postgres,
// naming both nodes, that connects to whichever is the primary
// (target_session_attrs=read-write): what a service is given in front of
// a Patroni cluster without a proxy. AsRole makes it a process role's.
func (c *PatroniCluster) URL(database string) string {
	hosts := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		hosts[i] = n.Addr
	}
	return "postgres://postgres@" + strings.Join(hosts, ",") + "/" + database +
		"?sslmode=disable&target_session_attrs=read-write"
}

// URL is a URL of database on this node alone, as the superuser.
func (n *PatroniNode) URL(database string) string {
	return "postgres://postgres@" + n.Addr + "/" + database + "?sslmode=disable"
}

// CreateDatabase creates database name on the leader and waits until
// every running node has it. A client of URL needs the standby to have
// it too: pgx, as libpq, tries the next host after a standby that refuses
// writes, but not after one that says the database does not exist (the
// standby has not replayed the CREATE DATABASE yet), so a service
// started right after would fail to connect.
func (c *PatroniCluster) CreateDatabase(t testing.TB, name string) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		t.Fatalf("testenv: connect to the Patroni cluster's leader: %v", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatalf("testenv: create database %s: %v", name, err)
	}
	for _, n := range c.Nodes {
		if !n.running() {
			continue
		}
		WaitFor(t, 30*time.Second, n.Name+" to have database "+name, func() bool {
			conn, err := pgx.Connect(ctx, n.URL(name))
			if err != nil {
				return false
			}
			_ = conn.Close(ctx)
			return true
		})
	}
}

// patroniMember is a member of Patroni's GET /cluster.
type patroniMember struct {
	Name     string `json:"name"`
	Role     string `json:"role"`  // leader, sync_standby, replica
	State    string `json:"state"` // running, ...
	Timeline int    `json:"timeline"`
	Lag      any    `json:"lag"` // bytes, or "unknown"
}

// patroniStatus is the part of Patroni's GET /patroni this file reads.
type patroniStatus struct {
	State       string               `json:"state"`
	Role        string               `json:"role"`
	Timeline    int                  `json:"timeline"`
	Replication []patroniReplication `json:"replication"`
}

// patroniReplication is a replication connection to a leader, from its
// pg_stat_replication.
type patroniReplication struct {
	ApplicationName string `json:"application_name"`
	State           string `json:"state"`      // streaming, ...
	SyncState       string `json:"sync_state"` // sync, async, ...
}

// Leader returns the node whose Patroni holds the leader key and runs
// PostgreSQL as the primary (GET /leader answers 200), failing t when
// none does.
func (c *PatroniCluster) Leader(t testing.TB) *PatroniNode {
	t.Helper()
	if n := c.leader(); n != nil {
		return n
	}
	t.Fatalf("testenv: Patroni cluster %s has no leader: %s", c.scope, c.describe())
	return nil
}

func (c *PatroniCluster) leader() *PatroniNode {
	for _, n := range c.Nodes {
		if n.running() && apiStatus(n.APIURL+"/leader") == http.StatusOK {
			return n
		}
	}
	return nil
}

// WaitHealthy waits until the cluster has a leader and every node whose
// Patroni runs is a standby streaming from it: its synchronous standby
// (GET /sync answers 200 and the leader's replication says sync), unless
// the cluster is asynchronous.
func (c *PatroniCluster) WaitHealthy(t testing.TB, timeout time.Duration) {
	t.Helper()
	what := "a leader and a streaming synchronous standby"
	if c.opts.Async {
		what = "a leader and a streaming standby"
	}
	WaitFor(t, timeout, "Patroni cluster "+c.scope+" to have "+what, c.healthy)
}

// WaitFailoverReady waits until the cluster is healthy (WaitHealthy) and
// every running standby holds each permanent slot: Patroni copies a
// logical slot to a standby by restarting it, and the leader takes the
// standby out of the synchronous key while it restarts.
func (c *PatroniCluster) WaitFailoverReady(t testing.TB, timeout time.Duration) {
	t.Helper()
	WaitFor(t, timeout, "Patroni cluster "+c.scope+" to be ready for a failover (healthy, permanent slots on every standby)", func() bool {
		return c.healthy() && c.slotsOnStandbys()
	})
}

// slotsOnStandbys reports whether every running standby has every
// permanent slot in pg_replication_slots.
func (c *PatroniCluster) slotsOnStandbys() bool {
	if len(c.opts.PermanentSlots) == 0 {
		return true
	}
	leader := c.leader()
	for _, n := range c.Nodes {
		if n == leader || !n.running() {
			continue
		}
		if !n.hasSlots(slices.Collect(maps.Keys(c.opts.PermanentSlots))) {
			return false
		}
	}
	return true
}

// hasSlots reports whether the node's PostgreSQL lists every slot named.
func (n *PatroniNode) hasSlots(names []string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, n.URL("postgres"))
	if err != nil {
		return false
	}
	defer func() { _ = conn.Close(context.Background()) }()
	var count int
	err = conn.QueryRow(ctx, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = ANY($1)", names).Scan(&count)
	return err == nil && count == len(names)
}

func (c *PatroniCluster) healthy() bool {
	leader := c.leader()
	if leader == nil {
		return false
	}
	var st patroniStatus
	if getJSON(leader.APIURL+"/patroni", &st) != nil || st.State != "running" {
		return false
	}
	for _, n := range c.Nodes {
		if n == leader || !n.running() {
			continue
		}
		streaming := slices.ContainsFunc(st.Replication, func(r patroniReplication) bool {
			return r.ApplicationName == n.Name && r.State == "streaming" && (c.opts.Async || r.SyncState == "sync")
		})
		if !streaming {
			return false
		}
		if !c.opts.Async && apiStatus(n.APIURL+"/sync") != http.StatusOK {
			return false
		}
		if c.opts.Async && apiStatus(n.APIURL+"/replica") != http.StatusOK {
			return false
		}
	}
	return true
}

// describe says what GET /cluster says of each member, for logs.
func (c *PatroniCluster) describe() string {
	for _, n := range c.Nodes {
		var cl struct {
			Members []patroniMember `json:"members"`
		}
		if !n.running() || getJSON(n.APIURL+"/cluster", &cl) != nil {
			continue
		}
		parts := make([]string, len(cl.Members))
		for i, m := range cl.Members {
			parts[i] = fmt.Sprintf("%s %s %s (timeline %d, lag %v)", m.Name, m.Role, m.State, m.Timeline, m.Lag)
		}
		return "members: " + strings.Join(parts, "; ")
	}
	return "no Patroni answers"
}

// KillLeader kills the leader as a machine dies: Patroni and PostgreSQL
// (the postmaster and every backend) with SIGKILL, nothing shut down,
// nothing handed over; the standby takes over when the leader key
// expires. It returns the node killed, which Start brings back.
//
// It first waits until the cluster can fail over (WaitFailoverReady): a
// leader killed while its standby is not in the synchronous key, or is
// restarting to take a copy of a permanent slot, is never replaced, as
// Patroni refuses to promote a standby that may lack acknowledged commits.
func (c *PatroniCluster) KillLeader(t testing.TB) *PatroniNode {
	t.Helper()
	c.WaitFailoverReady(t, patroniStartTimeout)
	n := c.Leader(t)
	if err := n.kill(); err != nil {
		t.Fatalf("testenv: kill Patroni %s: %v", n.Name, err)
	}
	return n
}

// WaitLeader waits until a node other than old is the leader and takes
// writes, and returns it.
func (c *PatroniCluster) WaitLeader(t testing.TB, old *PatroniNode) *PatroniNode {
	t.Helper()
	var leader *PatroniNode
	WaitFor(t, patroniFailoverTimeout, "a leader other than "+old.Name, func() bool {
		leader = c.leader()
		return leader != nil && leader != old
	})
	return leader
}

// WaitWritable waits until a node other than old takes writes (its
// PostgreSQL is out of recovery), polling each every 50 ms, and returns
// it and when it was first seen so: the moment a failover ends for the
// clients, which the measures of what the service does after it count
// from.
func (c *PatroniCluster) WaitWritable(t testing.TB, old *PatroniNode) (*PatroniNode, time.Time) {
	t.Helper()
	deadline := time.Now().Add(patroniFailoverTimeout)
	for time.Now().Before(deadline) {
		for _, n := range c.Nodes {
			if n != old && n.running() && n.writable() {
				return n, time.Now()
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("testenv: no node but %s took writes within %s: %s", old.Name, patroniFailoverTimeout, c.describe())
	return nil, time.Time{}
}

// Writable reports whether the node's PostgreSQL answers as a primary
// now (a second at most to say so), without failing anything: for a
// caller that watches a failover from a goroutine of its own.
func (n *PatroniNode) Writable() bool { return n.running() && n.writable() }

// Running reports whether the node's Patroni runs (it was not killed, or
// was started again).
func (n *PatroniNode) Running() bool { return n.running() }

// writable reports whether the node's PostgreSQL answers as a primary.
func (n *PatroniNode) writable() bool {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, n.URL("postgres"))
	if err != nil {
		return false
	}
	defer func() { _ = conn.Close(context.Background()) }()
	var recovering bool
	return conn.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&recovering) == nil && !recovering
}

// Switchover hands the leadership over to the other node, as an operator
// does before maintenance (POST /switchover to the leader's REST API:
// the leader shuts down cleanly once the candidate has everything), and
// waits until the cluster is healthy again with the old leader as its
// standby. It returns the new leader.
func (c *PatroniCluster) Switchover(t testing.TB) *PatroniNode {
	t.Helper()
	c.WaitFailoverReady(t, patroniStartTimeout)
	leader := c.Leader(t)
	var candidate *PatroniNode
	for _, n := range c.Nodes {
		if n != leader {
			candidate = n
		}
	}
	body, _ := json.Marshal(map[string]string{"leader": leader.Name, "candidate": candidate.Name})
	ctx, cancel := context.WithTimeout(context.Background(), patroniFailoverTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, leader.APIURL+"/switchover", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("testenv: switchover from %s to %s: %v", leader.Name, candidate.Name, err)
	}
	answer, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	// Patroni answers 503 "Switchover status unknown" when the old leader
	// has not stopped within its wait (some 20 s): a shutdown held up by
	// its clients on a busy machine. The switchover goes on; wait for it.
	unknown := resp.StatusCode == http.StatusServiceUnavailable && strings.Contains(string(answer), "status unknown")
	if unknown {
		t.Logf("testenv: switchover from %s to %s: %s %s; waiting for it", leader.Name, candidate.Name, resp.Status, answer)
	}
	if resp.StatusCode != http.StatusOK && !unknown {
		t.Fatalf("testenv: switchover from %s to %s: %s %s; %s", leader.Name, candidate.Name, resp.Status, answer, c.describe())
	}
	WaitFor(t, patroniFailoverTimeout, candidate.Name+" to lead", func() bool { return c.leader() == candidate })
	c.WaitHealthy(t, patroniStartTimeout)
	return candidate
}

// Close kills every process of the cluster and removes its directory,
// after logging the end of each node's log when t has failed (or
// TESTENV_PATRONI_LOGS is set). t's cleanup
// calls it; a test may call it earlier.
func (c *PatroniCluster) Close() {
	c.closeOnce.Do(func() {
		if c.t.Failed() || os.Getenv(patroniLogsVariable) != "" {
			c.logTails()
		}
		var errs []error
		for _, n := range c.Nodes {
			errs = append(errs, n.kill())
		}
		if c.etcd != nil {
			_ = c.etcd.Process.Kill()
			<-c.etcdDone
		}
		// Anything else started from the directory (a postmaster Patroni
		// was starting as it died).
		errs = append(errs, killMentioning(c.dir))
		errs = append(errs, os.RemoveAll(c.dir))
		if err := errors.Join(errs...); err != nil {
			c.t.Errorf("testenv: stop Patroni cluster %s: %v", c.scope, err)
		}
	})
}

// logTails logs the end of each node's log (Patroni's and PostgreSQL's),
// for a test that failed.
func (c *PatroniCluster) logTails() {
	for _, n := range c.Nodes {
		out, err := os.ReadFile(filepath.Join(n.dir, "patroni.log"))
		if err != nil {
			continue
		}
		c.t.Logf("--- Patroni %s log (last 6 KiB):\n%s", n.Name, lastBytes(out, 6<<10))
	}
}

func lastBytes(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// startEtcd starts one etcd member on free ports and waits until it is
// healthy.
func (c *PatroniCluster) startEtcd() error {
	client, peer := FreeAddr(c.t), FreeAddr(c.t)
	c.etcdAddr = client
	logFile, err := os.Create(filepath.Join(c.dir, "etcd.log"))
	if err != nil {
		return err
	}
	defer func() { _ = logFile.Close() }()                   // etcd has its own descriptor
	cmd := exec.CommandContext(context.Background(), "etcd", // Close kills it
		"--name", "etcd", "--data-dir", filepath.Join(c.dir, "etcd"),
		"--listen-client-urls", "http://"+client, "--advertise-client-urls", "http://"+client,
		"--listen-peer-urls", "http://"+peer, "--initial-advertise-peer-urls", "http://"+peer,
		"--initial-cluster", "etcd=http://"+peer, "--initial-cluster-state", "new",
		"--log-level", "warn")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := startTiedToTest(cmd); err != nil {
		return err
	}
	c.etcd, c.etcdDone = cmd, make(chan struct{})
	go func() { _ = cmd.Wait(); close(c.etcdDone) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var health struct {
			Health string `json:"health"`
		}
		if getJSON("http://"+client+"/health", &health) == nil && health.Health == "true" {
			return nil
		}
		select {
		case <-c.etcdDone:
			out, _ := os.ReadFile(filepath.Join(c.dir, "etcd.log"))
			return fmt.Errorf("etcd exited: %s", tail3k(out))
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			out, _ := os.ReadFile(filepath.Join(c.dir, "etcd.log"))
			return fmt.Errorf("etcd not healthy within 30s: %s", tail3k(out))
		}
	}
}

// writeConfig writes the node's patroni.yml (as JSON, which is YAML).
func (n *PatroniNode) writeConfig(apiAddr string) error {
	c := n.cluster
	parameters := map[string]any{
		"wal_level":             c.opts.WALLevel,
		"max_connections":       200,
		"max_wal_senders":       16,
		"max_replication_slots": 16,
		"wal_keep_size":         "256MB",
		"hot_standby":           "on",
		// pg_rewind needs hint bits logged (or data checksums) and
		// full-page writes.
		"wal_log_hints":      "on",
		"full_page_writes":   "on",
		"shared_buffers":     "32MB",
		"wal_sender_timeout": "10s",
		// A kill -9 of a process leaves what it wrote in the kernel's
		// page cache, which is all these tests do to a node: flushing it
		// to disk buys nothing here. synchronous_commit stays on: it is
		// what makes the standby synchronous.
		"fsync": "off",
	}
	dcs := map[string]any{
		"ttl":                     patroniTTL,
		"loop_wait":               patroniLoopWait,
		"retry_timeout":           patroniRetryTimeout,
		"maximum_lag_on_failover": 1 << 20,
		"synchronous_mode":        !c.opts.Async,
		"postgresql": map[string]any{
			"use_pg_rewind": true,
			"use_slots":     true,
			"parameters":    parameters,
		},
	}
	if len(c.opts.PermanentSlots) > 0 {
		dcs["permanent_slots"] = c.opts.PermanentSlots
	}
	cfg := map[string]any{
		"scope":     c.scope,
		"namespace": "/orders-test/",
		"name":      n.Name,
		"log":       map[string]any{"level": "INFO", "format": "%(asctime)s %(levelname)s: %(message)s"},
		"restapi":   map[string]any{"listen": apiAddr, "connect_address": apiAddr},
		"etcd3":     map[string]any{"hosts": []string{c.etcdAddr}},
		"bootstrap": map[string]any{
			"dcs": dcs,
			// --no-sync: as fsync=off, nothing here outlives a crash of
			// the machine.
			"initdb": []any{map[string]string{"encoding": "UTF8"}, map[string]string{"locale": "C.UTF-8"}, "no-sync"},
		},
		"postgresql": map[string]any{
			"listen":          n.Addr,
			"connect_address": n.Addr,
			"data_dir":        n.data,
			"bin_dir":         c.bin,
			"pgpass":          filepath.Join(n.dir, "pgpass"),
			// The standby's copy of the leader starts with a checkpoint:
			// at once, rather than spread over seconds.
			"basebackup": []any{map[string]string{"checkpoint": "fast"}},
			"authentication": map[string]any{
				"superuser":   map[string]string{"username": "postgres", "password": "postgres"},
				"replication": map[string]string{"username": "replicator", "password": "replicator"},
			},
			"parameters": map[string]any{"unix_socket_directories": n.dir},
			"pg_hba": []string{
				"local all all trust",
				"host all all 127.0.0.1/32 trust",
				"host replication all 127.0.0.1/32 trust",
			},
		},
	}
	b, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return err
	}
	path := filepath.Join(n.dir, "patroni.yml")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return err
	}
	return c.chown(path)
}

// Start starts the node's Patroni again after KillLeader: it recovers
// its PostgreSQL, rewinds it when it is ahead of the new leader's
// timeline (pg_rewind), and follows the leader. It does not wait: then
// WaitHealthy.
func (n *PatroniNode) Start(t testing.TB) {
	t.Helper()
	if err := n.start(); err != nil {
		t.Fatalf("testenv: start Patroni %s: %v", n.Name, err)
	}
}

func (n *PatroniNode) start() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd != nil {
		return errors.New("already running")
	}
	c := n.cluster
	logFile, err := os.OpenFile(filepath.Join(n.dir, "patroni.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer func() { _ = logFile.Close() }()                                                           // Patroni, and PostgreSQL after it, have their own descriptor
	cmd := exec.CommandContext(context.Background(), c.patroni, filepath.Join(n.dir, "patroni.yml")) // kill ends it
	cmd.Dir = n.dir
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Env = append(patroniEnvironment(), "HOME="+n.dir)
	ownProcessGroup(cmd) // kill takes its helpers too
	if c.asPostgres {
		if err := runAs(cmd, c.uid, c.gid); err != nil {
			return err
		}
	}
	if err := startTiedToTest(cmd); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	n.cmd, n.done = cmd, done
	return nil
}

// patroniEnvironment is this process's environment without what would
// point Patroni or PostgreSQL's tools elsewhere (PATRONI_*, PG*).
func patroniEnvironment() []string {
	return slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, "PATRONI_") || strings.HasPrefix(kv, "PG") || strings.HasPrefix(kv, "HOME=")
	})
}

func (n *PatroniNode) running() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.cmd != nil
}

// kill kills the node's Patroni and its PostgreSQL, every process of
// them, with SIGKILL, and waits until they are gone. PostgreSQL is not
// Patroni's child (Patroni starts it in a session of its own, as pg_ctl
// does), so it is found by its postmaster.pid.
func (n *PatroniNode) kill() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return nil
	}
	postmaster := n.postmasterPID() // before Patroni dies: it would start another
	_ = killGroup(n.cmd.Process.Pid)
	<-n.done
	n.cmd = nil
	var errs []error
	if postmaster > 0 {
		errs = append(errs, killGroup(postmaster))
	}
	errs = append(errs, killMentioning(n.dir))
	return errors.Join(errs...)
}

// PostmasterPID is the pid of the node's running postmaster, 0 when it
// has none.
func (n *PatroniNode) PostmasterPID() int { return n.postmasterPID() }

// Dir is the cluster's temporary directory: its configuration, data and
// logs, removed by Close.
func (c *PatroniCluster) Dir() string { return c.dir }

// postmasterPID reads the postmaster's pid from its postmaster.pid, and
// returns it when that process is the node's postmaster (its command line
// names the data directory), else 0.
func (n *PatroniNode) postmasterPID() int {
	b, err := os.ReadFile(filepath.Join(n.data, "postmaster.pid"))
	if err != nil {
		return 0
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil || !slices.Contains(mentioning(n.dir), pid) {
		return 0
	}
	return pid
}

// removePatroniLeftovers kills the processes and removes the directories
// of clusters whose test binary has gone without closing them (killed):
// Patroni and etcd died with it, but PostgreSQL is no child of theirs.
func removePatroniLeftovers() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), patroniDirPrefix+"*"))
	for _, dir := range dirs {
		b, err := os.ReadFile(filepath.Join(dir, logicalOwnerFile))
		if err != nil {
			if fi, err := os.Stat(dir); err == nil && time.Since(fi.ModTime()) > time.Hour {
				_ = killMentioning(dir)
				_ = os.RemoveAll(dir)
			}
			continue
		}
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid != os.Getpid() && !processAlive(pid) {
			_ = killMentioning(dir)
			_ = os.RemoveAll(dir)
		}
	}
}

// killMentioning kills, with their process groups, the processes whose
// command line names dir (a postmaster's -D, a Patroni's configuration,
// etcd's data directory), and waits until they are gone.
func killMentioning(dir string) error {
	var errs []error
	for _, pid := range mentioning(dir) {
		errs = append(errs, killGroup(pid))
	}
	return errors.Join(errs...)
}

// apiStatus is the status code of a GET of url, 0 when there is no answer.
func apiStatus(url string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// getJSON decodes the body of a GET of url that answers 200.
func getJSON(url string, v any) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}
