package deploy

import (
	"fmt"
	"maps"
	"net/url"
	"os"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/types"

	"github.com/yourorg/orders/internal/composesecrets"
	"github.com/yourorg/orders/internal/messaging"
	"github.com/yourorg/orders/internal/testenv"
)

// docker-compose.cluster.yml runs three RabbitMQ nodes in place of one. A
// cluster that does not form, or forms with a node short, shows only at
// `docker compose up`, and often only as a queue with fewer replicas than
// it should have: these checks catch it without a Docker engine. Each
// stack with more than one RabbitMQ service is held to them
// (clusterProblems); TestClusterChecks proves each one can fail.

func TestComposeClusterHasThreeNodes(t *testing.T) {
	t.Parallel()
	p := testenv.Compose(t, testenv.ComposeFile, testenv.ClusterComposeFile)
	if n := len(rabbitmqNodes(p)); n != 3 {
		t.Fatalf("%s: %d RabbitMQ services, want 3", testenv.ClusterComposeFile, n)
	}
}

func TestComposeClusterForms(t *testing.T) {
	t.Parallel()
	checkStacks(t, clusterProblems)
}

// rabbitmqNodes are the services that run RabbitMQ, by name.
func rabbitmqNodes(p *types.Project) []types.ServiceConfig {
	return servicesWhere(p, func(svc types.ServiceConfig) bool {
		repo, _, _ := imageParts(svc.Image)
		return repo == "rabbitmq"
	})
}

// clusterProblems checks a stack of several RabbitMQ services:
//
//   - each node has a fixed hostname (its node name is rabbit@<hostname>)
//     that the others reach: its service name or a network alias;
//   - all share one Erlang cookie: each installs the stack's
//     (composesecrets.ErlangCookieFile, from the secrets volume) as its
//     .erlang.cookie before it starts;
//   - each mounts a conf.d file that turns classic peer discovery on and
//     lists exactly the nodes of the stack;
//   - each gives quorum queues a replica on every node
//     (quorum_cluster_size in its advanced.config);
//   - one node boots first, alone; every other waits until a node is
//     healthy (two virgin nodes booting at once may each start a cluster
//     of their own);
//   - the clients (outbox-relay, order-consumer, orderctl) list every node
//     in AMQP_URL, and the consumer starts only once every node is healthy
//     (a quorum queue declared earlier has its replicas on the nodes there
//     were).
func clusterProblems(p *types.Project) []string {
	nodes := rabbitmqNodes(p)
	if len(nodes) < 2 {
		return nil
	}
	var problems []string
	var want []string // rabbit@<hostname> of every node
	hosts := map[string]bool{}
	for _, n := range nodes {
		if n.Hostname == "" {
			problems = append(problems, fmt.Sprintf("service %s sets no hostname: its node name (rabbit@<hostname>) would change with every container", n.Name))
			continue
		}
		want = append(want, "rabbit@"+n.Hostname)
		hosts[n.Hostname] = true
		if n.Hostname != n.Name && !hasAlias(n, n.Hostname) {
			problems = append(problems, fmt.Sprintf("service %s: the other nodes cannot reach rabbit@%s: %s is neither its service name nor a network alias", n.Name, n.Hostname, n.Hostname))
		}
	}
	slices.Sort(want)

	cookie := path.Join(composesecrets.Dir, composesecrets.ErlangCookieFile)
	first := 0 // the nodes that boot without waiting for another
	for _, n := range nodes {
		start := strings.Join(slices.Concat(n.Entrypoint, n.Command), " ")
		_, mounted := secretsMount(n)
		if !mounted || !strings.Contains(start, cookie) || !strings.Contains(start, ".erlang.cookie") {
			problems = append(problems, fmt.Sprintf("service %s does not install the cluster's cookie (%s, from the secrets volume) as its .erlang.cookie: it would make one of its own, and could not join", n.Name, cookie))
		}
		listed, discovery := classicConfigNodes(n)
		slices.Sort(listed)
		switch {
		case !discovery:
			problems = append(problems, fmt.Sprintf("service %s mounts no conf.d file with cluster_formation.peer_discovery_backend = classic_config: it would start a cluster of its own", n.Name))
		case !slices.Equal(listed, want):
			problems = append(problems, fmt.Sprintf("service %s: cluster_formation.classic_config.nodes lists %v, want the stack's nodes %v", n.Name, listed, want))
		}
		if size := quorumClusterSize(n); size != len(nodes) {
			problems = append(problems, fmt.Sprintf("service %s: quorum_cluster_size is %d (advanced.config), want %d: a quorum queue would not have a replica on every node", n.Name, size, len(nodes)))
		}
		waits := false
		for dep, d := range n.DependsOn {
			if d.Condition == types.ServiceConditionHealthy && slices.ContainsFunc(nodes, func(o types.ServiceConfig) bool { return o.Name == dep }) {
				waits = true
			}
		}
		if !waits {
			first++
		}
	}
	if first != 1 {
		problems = append(problems, fmt.Sprintf("%d RabbitMQ nodes boot without waiting for a healthy node, want 1: virgin nodes booting together may form separate clusters", first))
	}

	for _, binary := range []string{"outbox-relay", "order-consumer", "orderctl"} {
		for _, svc := range testenv.ComposeServicesOf(p, binary) {
			raw := envValue(svc, "AMQP_URL")
			urls, err := messaging.URLs(raw)
			if err != nil {
				continue // amqpLoginProblems reports it
			}
			var listed []string
			for _, u := range urls {
				if parsed, err := url.Parse(u); err == nil {
					listed = append(listed, parsed.Hostname())
				}
			}
			slices.Sort(listed)
			if wantHosts := slices.Sorted(maps.Keys(hosts)); !slices.Equal(listed, wantHosts) {
				problems = append(problems, fmt.Sprintf("service %s (%s): AMQP_URL lists %v, want every node once %v: a client moves only to a node it knows", svc.Name, binary, listed, wantHosts))
			}
			if binary != "order-consumer" {
				continue
			}
			for _, n := range nodes {
				if d, ok := svc.DependsOn[n.Name]; !ok || d.Condition != types.ServiceConditionHealthy {
					problems = append(problems, fmt.Sprintf("service %s may declare its queues before node %s has joined: make it depend on %s being healthy", svc.Name, n.Name, n.Name))
				}
			}
		}
	}
	return problems
}

func hasAlias(svc types.ServiceConfig, alias string) bool {
	for _, net := range svc.Networks {
		if net != nil && slices.Contains(net.Aliases, alias) {
			return true
		}
	}
	return false
}

// mountedFile returns the content of the bind mount of svc at target.
func mountedFile(svc types.ServiceConfig, match func(target string) bool) []string {
	var contents []string
	for _, v := range svc.Volumes {
		if v.Type != types.VolumeTypeBind || !match(v.Target) {
			continue
		}
		if raw, err := os.ReadFile(v.Source); err == nil {
			contents = append(contents, string(raw))
		}
	}
	return contents
}

// classicConfigNodes reads the conf.d files a node mounts: the nodes its
// classic peer discovery lists, and whether it is turned on.
func classicConfigNodes(svc types.ServiceConfig) (nodes []string, on bool) {
	confs := mountedFile(svc, func(target string) bool {
		return strings.HasPrefix(target, "/etc/rabbitmq/conf.d/") || target == "/etc/rabbitmq/rabbitmq.conf"
	})
	for _, conf := range confs {
		for line := range strings.Lines(conf) {
			key, val, ok := strings.Cut(line, "=")
			if !ok || strings.HasPrefix(strings.TrimSpace(key), "#") {
				continue
			}
			key, val = strings.TrimSpace(key), strings.TrimSpace(val)
			switch {
			case key == "cluster_formation.peer_discovery_backend":
				on = val == "classic_config" || val == "rabbit_peer_discovery_classic_config"
			case strings.HasPrefix(key, "cluster_formation.classic_config.nodes."):
				nodes = append(nodes, val)
			}
		}
	}
	return nodes, on
}

var quorumClusterSizeTerm = regexp.MustCompile(`\{\s*quorum_cluster_size\s*,\s*(\d+)\s*\}`)

// quorumClusterSize is the quorum_cluster_size of the advanced.config a
// node mounts; 3, RabbitMQ's default, when it sets none.
func quorumClusterSize(svc types.ServiceConfig) int {
	for _, conf := range mountedFile(svc, func(target string) bool { return target == "/etc/rabbitmq/advanced.config" }) {
		var lines []string // without %% comments
		for line := range strings.Lines(conf) {
			code, _, _ := strings.Cut(line, "%")
			lines = append(lines, code)
		}
		if m := quorumClusterSizeTerm.FindStringSubmatch(strings.Join(lines, "")); m != nil {
			n, _ := strconv.Atoi(m[1])
			return n
		}
	}
	return 3
}

func TestClusterChecks(t *testing.T) {
	t.Parallel()
	const conf = "cluster_formation.peer_discovery_backend = classic_config\n" +
		"cluster_formation.classic_config.nodes.1 = rabbit@mq-1\ncluster_formation.classic_config.nodes.2 = rabbit@mq-2\n"
	files := map[string]string{
		"cluster.conf":     conf,
		"two.conf":         "cluster_formation.peer_discovery_backend = classic_config\ncluster_formation.classic_config.nodes.1 = rabbit@mq-1\n",
		"nodiscovery.conf": "# cluster_formation.peer_discovery_backend = classic_config\n",
		"advanced.config":  "%% {quorum_cluster_size, 5}\n[{rabbit, [{quorum_cluster_size, 2}]}].\n",
		"three.config":     "[{rabbit, [{quorum_cluster_size, 3}]}].\n",
	}
	node := func(name, hostname, cookie, confFile, advanced, dependsOn string) string {
		body := "  " + name + ":\n    image: rabbitmq:3.13.7-management-alpine\n    healthcheck: {test: [CMD, rabbitmq-diagnostics, ping]}\n"
		if hostname != "" {
			body += "    hostname: " + hostname + "\n"
		}
		body += "    entrypoint: [sh, -c, 'install -m 0400 /run/orders-secrets/" + cookie + " \"$$HOME/.erlang.cookie\" && exec \"$$@\"', node]\n"
		body += "    command: [rabbitmq-server]\n"
		body += "    volumes: [./" + confFile + ":/etc/rabbitmq/conf.d/40-cluster.conf:ro, ./" + advanced + ":/etc/rabbitmq/advanced.config:ro, keys:/run/orders-secrets:ro]\n"
		if dependsOn != "" {
			body += "    depends_on: {" + dependsOn + ": {condition: service_healthy}}\n"
		}
		return body
	}
	consumer := func(amqpURL, dependsOn string) string {
		return "  consumer:\n    image: o:1\n    entrypoint: [/usr/local/bin/order-consumer]\n    environment: {AMQP_URL: \"" + amqpURL + "\"}\n" +
			"    depends_on: {" + dependsOn + "}\n"
	}
	const both = "amqp://u:p@mq-1:5672/,amqp://u:p@mq-2:5672/"
	const healthy = "mq-1: {condition: service_healthy}, mq-2: {condition: service_healthy}"
	good := map[string]string{
		"mq-1":     node("mq-1", "mq-1", "rabbitmq-erlang-cookie", "cluster.conf", "advanced.config", ""),
		"mq-2":     node("mq-2", "mq-2", "rabbitmq-erlang-cookie", "cluster.conf", "advanced.config", "mq-1"),
		"consumer": consumer(both, healthy),
	}
	doc := func(changes map[string]string) string {
		body := "services:\n"
		for _, name := range []string{"mq-1", "mq-2", "consumer"} {
			if c, ok := changes[name]; ok {
				body += c
				continue
			}
			body += good[name]
		}
		return body + "volumes:\n  keys:\n"
	}
	tests := []struct {
		name    string
		changes map[string]string
		want    []string
	}{
		{"a cluster that forms", nil, nil},
		{"a node without hostname", map[string]string{"mq-2": node("mq-2", "", "rabbitmq-erlang-cookie", "cluster.conf", "advanced.config", "mq-1")},
			[]string{"service mq-2 sets no hostname", "lists [rabbit@mq-1 rabbit@mq-2], want the stack's nodes [rabbit@mq-1]", "lists [rabbit@mq-1 rabbit@mq-2], want the stack's nodes [rabbit@mq-1]", "AMQP_URL lists [mq-1 mq-2], want every node once [mq-1]"}},
		{"a hostname nobody resolves", map[string]string{"mq-2": node("mq-2", "rabbit-two", "rabbitmq-erlang-cookie", "cluster.conf", "advanced.config", "mq-1")},
			[]string{"cannot reach rabbit@rabbit-two", "want the stack's nodes [rabbit@mq-1 rabbit@rabbit-two]", "want the stack's nodes [rabbit@mq-1 rabbit@rabbit-two]", "AMQP_URL lists [mq-1 mq-2], want every node once [mq-1 rabbit-two]"}},
		{"a cookie of its own", map[string]string{"mq-2": node("mq-2", "mq-2", "other-cookie", "cluster.conf", "advanced.config", "mq-1")},
			[]string{"service mq-2 does not install the cluster's cookie (/run/orders-secrets/rabbitmq-erlang-cookie, from the secrets volume)"}},
		{"no peer discovery", map[string]string{"mq-2": node("mq-2", "mq-2", "rabbitmq-erlang-cookie", "nodiscovery.conf", "advanced.config", "mq-1")},
			[]string{"service mq-2 mounts no conf.d file with cluster_formation.peer_discovery_backend = classic_config"}},
		{"a node missing from the list", map[string]string{"mq-2": node("mq-2", "mq-2", "rabbitmq-erlang-cookie", "two.conf", "advanced.config", "mq-1")},
			[]string{"service mq-2: cluster_formation.classic_config.nodes lists [rabbit@mq-1], want the stack's nodes [rabbit@mq-1 rabbit@mq-2]"}},
		{"fewer replicas than nodes", map[string]string{"mq-1": node("mq-1", "mq-1", "rabbitmq-erlang-cookie", "cluster.conf", "three.config", "")},
			[]string{"service mq-1: quorum_cluster_size is 3 (advanced.config), want 2"}},
		{"both nodes boot at once", map[string]string{"mq-2": node("mq-2", "mq-2", "rabbitmq-erlang-cookie", "cluster.conf", "advanced.config", "")},
			[]string{"2 RabbitMQ nodes boot without waiting"}},
		{"a client that knows one node", map[string]string{"consumer": consumer("amqp://u:p@mq-1:5672/", healthy)},
			[]string{"service consumer (order-consumer): AMQP_URL lists [mq-1], want every node once [mq-1 mq-2]"}},
		{"a consumer that starts early", map[string]string{"consumer": consumer(both, "mq-1: {condition: service_healthy}, mq-2: {condition: service_started}")},
			[]string{"service consumer may declare its queues before node mq-2 has joined"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p, err := loadComposeDoc(t, doc(tt.changes), files)
			if err != nil {
				t.Fatalf("load: %v\n%s", err, doc(tt.changes))
			}
			wantProblems(t, clusterProblems(p), tt.want)
		})
	}
}
