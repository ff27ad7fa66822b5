package deploy

import (
	"fmt"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/types"

	"github.com/yourorg/orders/internal/composesecrets"
	"github.com/yourorg/orders/internal/messaging"
	"github.com/yourorg/orders/internal/rabbitadmin"
	"github.com/yourorg/orders/internal/testenv"
)

// The compose broker's users are those of deploy/rabbitmq/definitions.json
// (and, in the demo, definitions.demo.json), as the secrets service renders
// them with the passwords it makes (internal/composesecrets); each process
// logs in as its own (rabbitadmin), with its password read from its file of
// the secrets volume. These checks keep the compose files and those files
// in step: a URL naming a user the broker does not have, or a password file
// that is another user's, fails only at `docker compose up`, with
// ACCESS_REFUSED in a log.

// amqpUsers is the user each binary logs in as.
var amqpUsers = map[string]string{
	"outbox-relay":   rabbitadmin.RelayUser,
	"order-consumer": rabbitadmin.ConsumerUser,
	"orderctl":       rabbitadmin.OperatorUser,
	"walkthrough":    rabbitadmin.WalkthroughUser,
}

func readDefinitions(t *testing.T) rabbitadmin.Definitions {
	t.Helper()
	root := testenv.RepoRoot(t)
	d, err := rabbitadmin.ReadDefinitions(filepath.Join(root, rabbitadmin.DefinitionsFile), filepath.Join(root, rabbitadmin.DemoDefinitionsFile))
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestComposeAMQPUsersMatchDefinitions(t *testing.T) {
	t.Parallel()
	checkStacks(t, func(p *types.Project) []string {
		d, err := renderedDefinitions(p)
		if err != nil {
			return []string{err.Error()}
		}
		return amqpLoginProblems(p, d)
	})
}

func TestComposeBrokerImportsDefinitions(t *testing.T) {
	t.Parallel()
	checkStacks(t, definitionsMountProblems)
}

// The walkthrough's user may publish to orders.events: the broker has it
// in the demo only.
func TestComposeWalkthroughUserOnlyInTheDemo(t *testing.T) {
	t.Parallel()
	for _, files := range stacks {
		d, err := renderedDefinitions(testenv.Compose(t, files...))
		if err != nil {
			t.Fatal(err)
		}
		_, has := d.User(rabbitadmin.WalkthroughUser)
		if demo := slices.Contains(files, testenv.DemoComposeFile); has != demo {
			t.Errorf("%s: the broker has %s: %v, want %v", strings.Join(files, " + "), rabbitadmin.WalkthroughUser, has, demo)
		}
	}
}

// amqpLoginProblems checks every AMQP_URL of the compose files against the
// definitions: the user of the binary the service runs, a password in that
// user's file of the secrets volume (never in the URL), a vhost it has
// permissions in.
func amqpLoginProblems(p *types.Project, d rabbitadmin.Definitions) []string {
	var problems []string
	for _, name := range serviceNames(p) {
		svc := p.Services[name]
		want, known := amqpUsers[entrypointBinary(svc)]
		raw := svc.Environment["AMQP_URL"]
		if raw == nil {
			if known {
				problems = append(problems, fmt.Sprintf("service %s (%s) sets no AMQP_URL: it would log in as guest, which the broker does not have", name, entrypointBinary(svc)))
			}
			continue
		}
		urls, err := messaging.URLs(*raw)
		if err != nil {
			problems = append(problems, fmt.Sprintf("service %s: AMQP_URL: %v", name, err))
			continue
		}
		// The URLs of a cluster's nodes differ only in host and port
		// (messaging.URLs checks it): the first says how all log in.
		u, err := url.Parse(urls[0])
		if err != nil || u.User == nil {
			problems = append(problems, fmt.Sprintf("service %s: AMQP_URL %q names no user", name, *raw))
			continue
		}
		user := u.User.Username()
		vhost := "/"
		if len(u.Path) > 1 {
			vhost = u.Path[1:]
		}
		_, ok := d.User(user)
		switch {
		case known && user != want:
			problems = append(problems, fmt.Sprintf("service %s (%s) logs in as %s, want %s", name, entrypointBinary(svc), user, want))
		case !ok:
			problems = append(problems, fmt.Sprintf("service %s logs in as %s, a user the broker's definitions do not have", name, user))
		}
		if !ok {
			continue
		}
		if _, has := u.User.Password(); has {
			problems = append(problems, fmt.Sprintf("service %s: AMQP_URL carries %s's password: give it in AMQP_PASSWORD_FILE", name, user))
		} else if file, want := envValue(svc, "AMQP_PASSWORD_FILE"), path.Join(composesecrets.Dir, composesecrets.RabbitMQUserFile(user)); file != want {
			problems = append(problems, fmt.Sprintf("service %s: AMQP_PASSWORD_FILE is %q, want %s, %s's password", name, file, want, user))
		}
		if _, ok := d.PermissionsOf(user, vhost); !ok {
			problems = append(problems, fmt.Sprintf("service %s: %s has no permissions in vhost %s", name, user, vhost))
		}
	}
	return problems
}

// definitionsMountProblems checks that the RabbitMQ service imports the
// definitions the secrets service renders: a configuration file in conf.d
// whose load_definitions names them in the secrets volume, which it mounts
// from the secrets service, once that has made them.
func definitionsMountProblems(p *types.Project) []string {
	var problems []string
	maker, hasMaker := secretsMaker(p)
	rendered := path.Join(composesecrets.Dir, composesecrets.RabbitMQDefinitions)
	for _, name := range serviceNames(p) {
		svc := p.Services[name]
		if repo, _, _ := imageParts(svc.Image); repo != "rabbitmq" {
			continue
		}
		var conf string    // where it is mounted
		var loads []string // the load_definitions of the mounted conf.d files
		for _, v := range svc.Volumes {
			if v.Type != types.VolumeTypeBind || !strings.HasPrefix(v.Target, "/etc/rabbitmq/conf.d/") || !strings.HasSuffix(v.Target, ".conf") {
				continue
			}
			conf = v.Target
			raw, err := os.ReadFile(v.Source)
			if err != nil {
				problems = append(problems, fmt.Sprintf("service %s: %v", name, err))
				continue
			}
			for line := range strings.Lines(string(raw)) {
				if k, val, ok := strings.Cut(line, "="); ok && strings.TrimSpace(k) == "load_definitions" {
					loads = append(loads, strings.TrimSpace(val))
				}
			}
		}
		mount, mounted := secretsMount(svc)
		makerMount, _ := secretsMount(maker)
		switch {
		case conf == "":
			problems = append(problems, fmt.Sprintf("service %s mounts no .conf file into /etc/rabbitmq/conf.d/ to load_definitions", name))
		case len(loads) != 1 || loads[0] != rendered:
			problems = append(problems, fmt.Sprintf("service %s: the load_definitions of %s are %v, want %s", name, conf, loads, rendered))
		case !hasMaker || !mounted || mount.Source != makerMount.Source:
			problems = append(problems, fmt.Sprintf("service %s does not mount the secrets volume at %s: the processes' users do not exist", name, composesecrets.Dir))
		case !waitsFor(p, svc, maker.Name, map[string]bool{}):
			problems = append(problems, fmt.Sprintf("service %s does not wait for service %s to render its definitions", name, maker.Name))
		}
	}
	return problems
}

func TestAMQPLoginChecks(t *testing.T) {
	t.Parallel()
	d := readDefinitions(t)
	relay := func(amqpURL, passwordFile string) string {
		body := "services:\n  relay:\n    image: o:1\n    entrypoint: [/usr/local/bin/outbox-relay]\n"
		if amqpURL != "" {
			body += "    environment: {AMQP_URL: \"" + amqpURL + "\", AMQP_PASSWORD_FILE: \"" + passwordFile + "\"}\n"
		}
		return body
	}
	const own = "/run/orders-secrets/rabbitmq-orders-relay"
	tests := []struct {
		name, doc string
		want      []string
	}{
		{"its user", relay("amqp://orders-relay@rabbitmq:5672/", own), nil},
		{"guest", relay("amqp://guest@rabbitmq:5672/", own), []string{"logs in as guest, want orders-relay"}},
		{"another process's user", relay("amqp://orders-consumer@rabbitmq:5672/", "/run/orders-secrets/rabbitmq-orders-consumer"), []string{"logs in as orders-consumer, want orders-relay"}},
		{"a password in the URL", relay("amqp://orders-relay:secret@rabbitmq:5672/", own), []string{"AMQP_URL carries orders-relay's password"}},
		{"another user's password file", relay("amqp://orders-relay@rabbitmq:5672/", "/run/orders-secrets/rabbitmq-orders-admin"), []string{"want /run/orders-secrets/rabbitmq-orders-relay"}},
		{"another vhost", relay("amqp://orders-relay@rabbitmq:5672/other", own), []string{"has no permissions in vhost other"}},
		{"no AMQP_URL", relay("", ""), []string{"sets no AMQP_URL"}},
		{"the nodes of a cluster", relay("amqp://orders-relay@rabbitmq-1:5672/,amqp://orders-relay@rabbitmq-2:5672/", own), nil},
		{"a cluster's nodes, another user on one", relay("amqp://orders-relay@rabbitmq-1:5672/,amqp://guest@rabbitmq-2:5672/", own),
			[]string{"URL 2 of 2 differs from the first"}},
		{"a cluster's nodes, all another user", relay("amqp://guest@rabbitmq-1:5672/,amqp://guest@rabbitmq-2:5672/", own), []string{"logs in as guest"}},
		{"a cluster's nodes, a password in each URL", relay("amqp://orders-relay:secret@rabbitmq-1:5672/,amqp://orders-relay:secret@rabbitmq-2:5672/", own),
			[]string{"AMQP_URL carries orders-relay's password"}},
		{"a tool as an unknown user", "services:\n  tool:\n    image: o:1\n    environment: {AMQP_URL: \"amqp://nobody@rabbitmq:5672/\"}\n", []string{"a user the broker's definitions do not have"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p, err := loadComposeDoc(t, tt.doc, nil)
			if err != nil {
				t.Fatal(err)
			}
			wantProblems(t, amqpLoginProblems(p, d), tt.want)
		})
	}
}

func TestDefinitionsMountChecks(t *testing.T) {
	t.Parallel()
	const conf = "load_definitions = /run/orders-secrets/rabbitmq-definitions.json\n"
	const maker = "  secrets:\n    image: o:1\n    entrypoint: [/usr/local/bin/compose-secrets]\n    restart: \"no\"\n    volumes: [\"keys:/run/orders-secrets\"]\n"
	broker := func(volumes, deps string) string {
		return "services:\n" + maker + "  mq:\n    image: rabbitmq:3.13.7-management-alpine\n    volumes: [" + volumes + "]\n" + deps + "volumes:\n  keys:\n  other:\n"
	}
	const waits = "    depends_on: {secrets: {condition: service_completed_successfully}}\n"
	tests := []struct {
		name, doc string
		files     map[string]string
		want      []string
	}{
		{"the rendered definitions", broker(`"keys:/run/orders-secrets:ro", "./d.conf:/etc/rabbitmq/conf.d/30-d.conf:ro"`, waits), map[string]string{"d.conf": conf}, nil},
		{"no conf", broker(`"keys:/run/orders-secrets:ro"`, waits), nil, []string{"mounts no .conf file"}},
		{"the repository's file", broker(`"keys:/run/orders-secrets:ro", "./d.conf:/etc/rabbitmq/conf.d/30-d.conf:ro"`, waits), map[string]string{"d.conf": "load_definitions = /etc/rabbitmq/definitions.json\n"}, []string{"want /run/orders-secrets/rabbitmq-definitions.json"}},
		{"another volume", broker(`"other:/run/orders-secrets:ro", "./d.conf:/etc/rabbitmq/conf.d/30-d.conf:ro"`, waits), map[string]string{"d.conf": conf}, []string{"does not mount the secrets volume"}},
		{"not waiting", broker(`"keys:/run/orders-secrets:ro", "./d.conf:/etc/rabbitmq/conf.d/30-d.conf:ro"`, ""), map[string]string{"d.conf": conf}, []string{"does not wait for service secrets"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p, err := loadComposeDoc(t, tt.doc, tt.files)
			if err != nil {
				t.Fatal(err)
			}
			wantProblems(t, definitionsMountProblems(p), tt.want)
		})
	}
}

// definitionsLabel is the label of the broker that names the definitions
// the secrets service renders for it.
const definitionsLabel = "orders.rabbitmq-definitions"

// The broker imports its users at boot only, and docker compose recreates
// a container only when its own configuration changes: the demo's
// definitions (its walkthrough user) reach a running broker only if the
// broker's configuration changes with them. So the broker carries the
// secrets service's -definitions as a label, in every stack.
func TestComposeBrokerRestartsWithNewDefinitions(t *testing.T) {
	t.Parallel()
	checkStacks(t, definitionsLabelProblems)
}

// definitionsLabelProblems lists the brokers that wait for the secrets
// service (the first node of a cluster; the others join it) whose
// definitionsLabel is not the -definitions the secrets service renders.
func definitionsLabelProblems(p *types.Project) []string {
	maker, ok := secretsMaker(p)
	if !ok {
		return nil // definitionsMountProblems says so
	}
	rendered := ""
	if i := slices.Index(maker.Command, "-definitions"); i >= 0 && i+1 < len(maker.Command) {
		rendered = maker.Command[i+1]
	}
	var problems []string
	for _, name := range serviceNames(p) {
		svc := p.Services[name]
		if repo, _, _ := imageParts(svc.Image); repo != "rabbitmq" {
			continue
		}
		if _, waits := svc.DependsOn[maker.Name]; !waits {
			continue
		}
		if got := svc.Labels[definitionsLabel]; got != rendered {
			problems = append(problems, fmt.Sprintf("service %s: label %s is %q, want %q, the -definitions of service %s: else a broker that runs already never imports them", name, definitionsLabel, got, rendered, maker.Name))
		}
	}
	return problems
}

func TestDefinitionsLabelChecks(t *testing.T) {
	t.Parallel()
	doc := func(label string) string {
		return "services:\n  secrets:\n    image: o:1\n    entrypoint: [/usr/local/bin/compose-secrets]\n    command: [-definitions, \"a.json,b.json\"]\n" +
			"  mq:\n    image: rabbitmq:3.13.7-management-alpine\n    depends_on: {secrets: {condition: service_completed_successfully}}\n" + label
	}
	for label, want := range map[string][]string{
		"    labels: {orders.rabbitmq-definitions: \"a.json,b.json\"}\n": nil,
		"    labels: {orders.rabbitmq-definitions: a.json}\n":            {`is "a.json", want "a.json,b.json"`},
		"": {`is "", want "a.json,b.json"`},
	} {
		p, err := loadComposeDoc(t, doc(label), nil)
		if err != nil {
			t.Fatal(err)
		}
		wantProblems(t, definitionsLabelProblems(p), want)
	}
}
