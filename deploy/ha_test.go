package deploy

import (
	"cmp"
	"fmt"
	"maps"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/types"
	"github.com/jackc/pgx/v5/pgconn"
	"go.yaml.in/yaml/v3"

	"github.com/yourorg/orders/internal/testenv"
)

// docker-compose.ha.yml runs PostgreSQL as a primary and a standby under
// Patroni, with etcd, from an image deploy/patroni/Dockerfile builds. What
// goes wrong with such a stack shows at `docker compose up`, or only at
// the first failover: a process pinned to one node, two nodes racing to
// initialise, a standby that may lose what the primary acknowledged, an
// image pulled from elsewhere. These checks catch it without a Docker
// engine (compose_test.go's checks hold for the stack too: it is one of
// stacks); TestHAChecks proves each one can fail.

const (
	patroniDockerfile = "deploy/patroni/Dockerfile"
	patroniConfig     = "deploy/patroni/patroni.yml"
	// patroniDataDir is where a node keeps its data: a volume of its own.
	patroniDataDir = "/var/lib/postgresql/data"
)

// haClients are the binaries that connect to the database, and so must
// find the primary wherever it is.
var haClients = []string{"order-api", "outbox-relay", "order-consumer", "orderctl"}

func TestComposeHAStack(t *testing.T) {
	t.Parallel()
	for _, files := range [][]string{
		{testenv.ComposeFile, testenv.HAComposeFile},
		{testenv.ComposeFile, testenv.ClusterComposeFile, testenv.HAComposeFile},
	} {
		cfg := parsePatroniConfig(t, readRepoFile(t, patroniConfig))
		for _, problem := range haProblems(testenv.Compose(t, files...), cfg) {
			t.Errorf("%s: %s", strings.Join(files, " + "), problem)
		}
	}
}

func TestPatroniImage(t *testing.T) {
	t.Parallel()
	base := parseDockerfile(readRepoFile(t, "Dockerfile"))[0].base
	reportProblems(t, patroniDockerfileProblems(readRepoFile(t, patroniDockerfile), base))
	reportProblems(t, patroniConfigProblems(parsePatroniConfig(t, readRepoFile(t, patroniConfig))))
}

// patroniConf is the part of Patroni's configuration the checks read.
type patroniConf struct {
	Etcd3 struct {
		Hosts any `yaml:"hosts"` // "host:port", or a list of them
	} `yaml:"etcd3"`
	Bootstrap struct {
		DCS struct {
			TTL             int  `yaml:"ttl"`
			LoopWait        int  `yaml:"loop_wait"`
			RetryTimeout    int  `yaml:"retry_timeout"`
			SynchronousMode bool `yaml:"synchronous_mode"`
			PermanentSlots  map[string]struct {
				Type     string `yaml:"type"`
				Database string `yaml:"database"`
				Plugin   string `yaml:"plugin"`
			} `yaml:"permanent_slots"`
			PostgreSQL struct {
				UsePgRewind bool `yaml:"use_pg_rewind"`
				Parameters  struct {
					WALLevel string `yaml:"wal_level"`
				} `yaml:"parameters"`
			} `yaml:"postgresql"`
		} `yaml:"dcs"`
	} `yaml:"bootstrap"`
}

func parsePatroniConfig(t *testing.T, text string) patroniConf {
	t.Helper()
	var c patroniConf
	if err := yaml.Unmarshal([]byte(text), &c); err != nil {
		t.Fatalf("%s: %v", patroniConfig, err)
	}
	return c
}

// etcdHosts are the host names of Patroni's etcd3 hosts.
func (c patroniConf) etcdHosts() []string {
	var list []string
	switch h := c.Etcd3.Hosts.(type) {
	case string:
		list = strings.Split(h, ",")
	case []any:
		for _, x := range h {
			list = append(list, fmt.Sprint(x))
		}
	}
	var hosts []string
	for _, h := range list {
		name, _, _ := strings.Cut(strings.TrimSpace(h), ":")
		hosts = append(hosts, name)
	}
	return hosts
}

// patroniNodes are the services that run a Patroni node: those that name
// one (PATRONI_NAME), in name order.
func patroniNodes(p *types.Project) []types.ServiceConfig {
	return servicesWhere(p, func(svc types.ServiceConfig) bool { return envValue(svc, "PATRONI_NAME") != "" })
}

// haProblems checks a stack that runs PostgreSQL under Patroni:
//
//   - two nodes at least, each with its own Patroni name, reached by it
//     (its host name or a network alias), and its own data volume;
//   - every node runs the image deploy/patroni/Dockerfile builds, built
//     once;
//   - the etcd of Patroni's configuration is a service with a health
//     check; one node waits for it, and every other node waits for a node
//     to be healthy: two empty nodes starting at once race to initialise;
//   - every process that connects to the database names every node in
//     DATABASE_URL (and RELAY_WAL_DATABASE_URL) with
//     target_session_attrs=read-write: it finds the primary wherever it is;
//   - the log-tailing relay's slot (its RELAY_WAL_SLOT, in its database)
//     is one of Patroni's permanent slots, logical with pgoutput, and
//     wal_level is logical: else a new primary has no slot, and the relay
//     makes one at the end of the log.
func haProblems(p *types.Project, cfg patroniConf) []string {
	nodes := patroniNodes(p)
	if len(nodes) < 2 {
		return []string{fmt.Sprintf("%d services run a Patroni node (set PATRONI_NAME), want 2 at least", len(nodes))}
	}
	var problems []string
	var names []string
	volumes := map[string]string{} // data volume -> node
	builders := 0
	for _, n := range nodes {
		name := envValue(n, "PATRONI_NAME")
		if slices.Contains(names, name) {
			problems = append(problems, fmt.Sprintf("services %s and another are both Patroni node %s", n.Name, name))
		}
		names = append(names, name)
		if n.Hostname != name && !hasAlias(n, name) && n.Name != name {
			problems = append(problems, fmt.Sprintf("service %s is Patroni node %s, but no one reaches it by that name: set its hostname or a network alias", n.Name, name))
		}
		data := ""
		for _, v := range n.Volumes {
			if v.Target == patroniDataDir && v.Type == types.VolumeTypeVolume {
				data = v.Source
			}
		}
		switch {
		case data == "":
			problems = append(problems, fmt.Sprintf("service %s keeps its data (%s) in no volume: it is lost with the container", n.Name, patroniDataDir))
		case volumes[data] != "":
			problems = append(problems, fmt.Sprintf("services %s and %s share the data volume %s", volumes[data], n.Name, data))
		default:
			volumes[data] = n.Name
		}
		if n.Build != nil {
			builders++
			if dockerfileOf(n.Build) != filepath.Join(p.WorkingDir, patroniDockerfile) {
				problems = append(problems, fmt.Sprintf("service %s builds %s, not %s", n.Name, dockerfileOf(n.Build), patroniDockerfile))
			}
		}
	}
	if builders != 1 {
		problems = append(problems, fmt.Sprintf("%d Patroni nodes build the image, want one (the others name its image)", builders))
	}
	for _, n := range nodes[1:] {
		if n.Image != nodes[0].Image {
			problems = append(problems, fmt.Sprintf("service %s runs image %q, service %s %q: the nodes run one image", n.Name, n.Image, nodes[0].Name, nodes[0].Image))
		}
	}

	// Who starts first.
	waitsHealthy := func(svc types.ServiceConfig, match func(string) bool) bool {
		for dep, d := range svc.DependsOn {
			if match(dep) && d.Condition == types.ServiceConditionHealthy {
				return true
			}
		}
		return false
	}
	isNode := func(name string) bool {
		return slices.ContainsFunc(nodes, func(n types.ServiceConfig) bool { return n.Name == name })
	}
	etcd := cfg.etcdHosts()
	if len(etcd) == 0 {
		problems = append(problems, patroniConfig+" names no etcd3 hosts")
	}
	for _, host := range etcd {
		svc, ok := p.Services[host]
		if !ok {
			problems = append(problems, fmt.Sprintf("%s: etcd host %s is not a service", patroniConfig, host))
		} else if !hasHealthcheck(svc) {
			problems = append(problems, fmt.Sprintf("service %s (etcd) has no healthcheck: the nodes cannot wait for it", host))
		}
	}
	first := 0
	for _, n := range nodes {
		switch {
		case waitsHealthy(n, isNode):
		case waitsHealthy(n, func(dep string) bool { return slices.Contains(etcd, dep) }):
			first++
		default:
			problems = append(problems, fmt.Sprintf("service %s waits neither for etcd nor for another node to be healthy", n.Name))
		}
	}
	if first > 1 {
		problems = append(problems, fmt.Sprintf("%d Patroni nodes start as soon as etcd is healthy: one initialises the cluster, the others wait until it is healthy", first))
	}

	// Where the processes connect.
	for _, binary := range haClients {
		for _, svc := range testenv.ComposeServicesOf(p, binary) {
			for _, variable := range []string{"DATABASE_URL", "RELAY_WAL_DATABASE_URL"} {
				if v := envValue(svc, variable); v != "" || variable == "DATABASE_URL" {
					problems = append(problems, multiHostProblems(svc.Name, variable, v, names)...)
				}
			}
		}
	}

	// The relay's slot, on whichever node leads.
	for _, svc := range testenv.ComposeServicesOf(p, "outbox-relay") {
		slot := cmp.Or(envValue(svc, "RELAY_WAL_SLOT"), relayDefaultSlot)
		db, err := pgconn.ParseConfig(envValue(svc, "DATABASE_URL"))
		if err != nil {
			continue // multiHostProblems said so
		}
		dcs := cfg.Bootstrap.DCS
		if s, ok := dcs.PermanentSlots[slot]; !ok || s.Type != "logical" || s.Database != db.Database || s.Plugin != "pgoutput" {
			problems = append(problems, fmt.Sprintf("%s: service %s's replication slot %s (RELAY_WAL_SLOT) is not a permanent slot of type logical, database %s, plugin pgoutput (%+v): a new primary would not have it",
				patroniConfig, svc.Name, slot, db.Database, s))
		}
		if dcs.PostgreSQL.Parameters.WALLevel != "logical" {
			problems = append(problems, fmt.Sprintf("%s: wal_level %q: the log-tailing relay (service %s) needs logical", patroniConfig, dcs.PostgreSQL.Parameters.WALLevel, svc.Name))
		}
	}
	return problems
}

// relayDefaultSlot is outbox-relay's RELAY_WAL_SLOT when it is not set.
const relayDefaultSlot = "orders_outbox_relay"

// multiHostProblems checks a connection URL of service: it names every
// one of nodes and asks for the one that takes writes.
func multiHostProblems(service, variable, dsn string, nodes []string) []string {
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return []string{fmt.Sprintf("service %s: %s %q: %v", service, variable, dsn, err)}
	}
	hosts := []string{cfg.Host}
	for _, f := range cfg.Fallbacks {
		hosts = append(hosts, f.Host)
	}
	var problems []string
	for _, n := range nodes {
		if !slices.Contains(hosts, n) {
			problems = append(problems, fmt.Sprintf("service %s: %s names hosts %v, not node %s: it would not follow the primary there", service, variable, slices.Compact(hosts), n))
		}
	}
	_, query, _ := strings.Cut(dsn, "?")
	q, _ := url.ParseQuery(query)
	if got := q.Get("target_session_attrs"); got != "read-write" {
		problems = append(problems, fmt.Sprintf("service %s: %s has target_session_attrs=%q: without read-write it may connect to the standby, which refuses every write", service, variable, got))
	}
	return problems
}

// patroniDockerfileProblems checks deploy/patroni/Dockerfile: built FROM
// base (the project's own Dockerfile's build stage: the same Debian, and
// no other image pulled) or a stage of its own, with Debian's packages of
// PostgreSQL 15, Patroni and etcd, and no frontend fetched.
func patroniDockerfileProblems(text, base string) []string {
	problems := frontendProblems(text)
	stages := parseDockerfile(text)
	for i, s := range stages {
		if s.base != base && stageIndex(stages[:i], s.base) < 0 {
			problems = append(problems, fmt.Sprintf("%s: stage %d is FROM %s: build FROM %s, the project's own base, or a stage, so that nothing else is pulled", patroniDockerfile, i, s.base, base))
		}
	}
	var installs []string
	for _, s := range stages {
		for _, in := range s.instructions {
			if in.keyword != "RUN" {
				continue
			}
			for cmd := range strings.SplitSeq(in.args, "&&") {
				fields := strings.Fields(cmd)
				if len(fields) > 1 && fields[0] == "apt-get" && slices.Contains(fields, "install") {
					installs = append(installs, fields...)
				}
			}
		}
	}
	for _, pkg := range []string{"postgresql-15", "patroni", "etcd-server"} {
		if !slices.Contains(installs, pkg) {
			problems = append(problems, fmt.Sprintf("%s does not apt-get install %s", patroniDockerfile, pkg))
		}
	}
	return problems
}

// patroniConfigProblems checks Patroni's configuration: a synchronous
// standby (no acknowledged commit lost at a failover: the stack shows the
// setting that keeps the service's promises), pg_rewind (a failed primary
// comes back as a standby), and timings Patroni accepts (loop_wait + 2 *
// retry_timeout within the ttl, or it demotes a healthy leader).
func patroniConfigProblems(c patroniConf) []string {
	var problems []string
	dcs := c.Bootstrap.DCS
	if !dcs.SynchronousMode {
		problems = append(problems, patroniConfig+": synchronous_mode is off: a failover may lose commits the primary acknowledged (docs/high-availability.md)")
	}
	if !dcs.PostgreSQL.UsePgRewind {
		problems = append(problems, patroniConfig+": use_pg_rewind is off: a failed primary that was ahead cannot rejoin as a standby")
	}
	if dcs.TTL == 0 || dcs.LoopWait+2*dcs.RetryTimeout > dcs.TTL {
		problems = append(problems, fmt.Sprintf("%s: ttl %d, loop_wait %d, retry_timeout %d: Patroni needs loop_wait + 2 * retry_timeout <= ttl", patroniConfig, dcs.TTL, dcs.LoopWait, dcs.RetryTimeout))
	}
	return problems
}

// Each HA check fails on the mistake it is for.
func TestHAChecks(t *testing.T) {
	t.Parallel()
	files := []string{testenv.ComposeFile, testenv.HAComposeFile}
	goodConfig := readRepoFile(t, patroniConfig)
	edit := func(name string, change func(*types.ServiceConfig)) func(*types.Project) {
		return func(p *types.Project) {
			svc := p.Services[name]
			svc.Environment = maps.Clone(svc.Environment)
			svc.DependsOn = maps.Clone(svc.DependsOn)
			svc.Volumes = slices.Clone(svc.Volumes)
			change(&svc)
			p.Services[name] = svc
		}
	}
	setEnv := func(name, variable, value string) func(*types.Project) {
		return edit(name, func(svc *types.ServiceConfig) { svc.Environment[variable] = &value })
	}
	const nodeURL = "postgres://orders_api@postgres-1:5432/orders?sslmode=disable"
	for _, tt := range []struct {
		name   string
		change func(*types.Project)
		config [2]string // an edit of patroni.yml
		want   string
	}{
		{name: "the file as it is"},
		{name: "one node", change: func(p *types.Project) { delete(p.Services, "postgres-2") }, want: "1 services run a Patroni node"},
		{name: "same name", change: setEnv("postgres-2", "PATRONI_NAME", "postgres-1"), want: "both Patroni node postgres-1"},
		{name: "unreachable name", change: setEnv("postgres-2", "PATRONI_NAME", "postgres-3"), want: "no one reaches it"},
		{name: "shared data", change: edit("postgres-2", func(svc *types.ServiceConfig) {
			for i := range svc.Volumes {
				if svc.Volumes[i].Target == patroniDataDir {
					svc.Volumes[i].Source = "postgres-1-data"
				}
			}
		}), want: "share the data volume"},
		{name: "no data volume", change: edit("postgres-2", func(svc *types.ServiceConfig) {
			svc.Volumes = slices.DeleteFunc(svc.Volumes, func(v types.ServiceVolumeConfig) bool { return v.Target == patroniDataDir })
		}), want: "in no volume"},
		{name: "both build", change: edit("postgres-2", func(svc *types.ServiceConfig) {
			b := *p0(t, files).Services["postgres"].Build
			svc.Build = &b
		}), want: "2 Patroni nodes build the image"},
		{name: "both start at once", change: edit("postgres-2", func(svc *types.ServiceConfig) {
			svc.DependsOn = types.DependsOnConfig{"etcd": {Condition: types.ServiceConditionHealthy}}
		}), want: "2 Patroni nodes start as soon as etcd is healthy"},
		{name: "no wait", change: edit("postgres-2", func(svc *types.ServiceConfig) { svc.DependsOn = nil }), want: "waits neither for etcd"},
		{name: "etcd unhealthy", change: edit("etcd", func(svc *types.ServiceConfig) { svc.HealthCheck = nil }), want: "(etcd) has no healthcheck"},
		{name: "etcd elsewhere", config: [2]string{"hosts: etcd:2379", "hosts: etcd-1:2379"}, want: "etcd host etcd-1 is not a service"},
		{name: "one host", change: setEnv("order-api", "DATABASE_URL", nodeURL+"&target_session_attrs=read-write"), want: "not node postgres-2"},
		{name: "any node", change: setEnv("order-api", "DATABASE_URL", "postgres://orders_api@postgres-1:5432,postgres-2:5432/orders?sslmode=disable"), want: `target_session_attrs=""`},
		{name: "wal relay on one node", change: setEnv("outbox-relay", "RELAY_WAL_DATABASE_URL", nodeURL), want: "service outbox-relay: RELAY_WAL_DATABASE_URL"},
		{name: "no permanent slot", config: [2]string{"orders_outbox_relay:\n", "other_slot:\n"}, want: "replication slot orders_outbox_relay (RELAY_WAL_SLOT) is not a permanent slot"},
		{name: "another slot", change: setEnv("outbox-relay", "RELAY_WAL_SLOT", "relay_2"), want: "replication slot relay_2 (RELAY_WAL_SLOT) is not a permanent slot"},
		{name: "slot of another database", config: [2]string{"database: orders", "database: postgres"}, want: "is not a permanent slot of type logical, database orders"},
		{name: "replica wal_level", config: [2]string{"wal_level: logical", "wal_level: replica"}, want: `wal_level "replica"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := p0(t, files)
			if tt.change != nil {
				tt.change(p)
			}
			config := goodConfig
			if tt.config[0] != "" {
				if !strings.Contains(config, tt.config[0]) {
					t.Fatalf("%s has no %q", patroniConfig, tt.config[0])
				}
				config = strings.Replace(config, tt.config[0], tt.config[1], 1)
			}
			checkWant(t, haProblems(p, parsePatroniConfig(t, config)), tt.want)
		})
	}

	goodDockerfile := readRepoFile(t, patroniDockerfile)
	base := parseDockerfile(readRepoFile(t, "Dockerfile"))[0].base
	for _, tt := range []struct{ name, old, new, want string }{
		{name: "the file as it is"},
		{name: "another base", old: "FROM " + base + " AS debian", new: "FROM debian:12-slim AS debian", want: "stage 0 is FROM debian:12-slim"},
		{name: "no patroni", old: "postgresql-15 patroni", new: "postgresql-15", want: "does not apt-get install patroni"},
		{name: "a frontend", old: "", new: "# syntax=docker/dockerfile:1\n", want: "parser directive"},
	} {
		t.Run("Dockerfile "+tt.name, func(t *testing.T) {
			text := goodDockerfile
			if tt.new != "" {
				if tt.old == "" {
					text = tt.new + text
				} else if text = strings.Replace(text, tt.old, tt.new, 1); text == goodDockerfile {
					t.Fatalf("%s has no %q", patroniDockerfile, tt.old)
				}
			}
			checkWant(t, patroniDockerfileProblems(text, base), tt.want)
		})
	}

	for _, tt := range []struct{ name, old, new, want string }{
		{name: "the file as it is"},
		{name: "asynchronous", old: "synchronous_mode: true", new: "synchronous_mode: false", want: "synchronous_mode is off"},
		{name: "no rewind", old: "use_pg_rewind: true", new: "use_pg_rewind: false", want: "use_pg_rewind is off"},
		{name: "timings", old: "retry_timeout: 3", new: "retry_timeout: 10", want: "loop_wait + 2 * retry_timeout <= ttl"},
	} {
		t.Run("patroni.yml "+tt.name, func(t *testing.T) {
			text := strings.Replace(goodConfig, tt.old, tt.new, 1)
			if tt.old != "" && text == goodConfig {
				t.Fatalf("%s has no %q", patroniConfig, tt.old)
			}
			checkWant(t, patroniConfigProblems(parsePatroniConfig(t, text)), tt.want)
		})
	}
}

// p0 loads files afresh: each case changes its own copy.
func p0(t *testing.T, files []string) *types.Project {
	t.Helper()
	return testenv.Compose(t, files...)
}

// checkWant fails t unless problems is empty when want is, or has a
// problem that says want.
func checkWant(t *testing.T, problems []string, want string) {
	t.Helper()
	if want == "" {
		if len(problems) > 0 {
			t.Errorf("problems in the good file: %q", problems)
		}
		return
	}
	if !slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, want) }) {
		t.Errorf("no problem says %q: %q", want, problems)
	}
}
