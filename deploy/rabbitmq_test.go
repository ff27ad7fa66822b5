package deploy

import (
	"fmt"
	"maps"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/types"

	"github.com/yourorg/orders/internal/messaging"
	"github.com/yourorg/orders/internal/rabbitadmin"
	"github.com/yourorg/orders/internal/testenv"
)

// The compose broker's users are deploy/rabbitmq/definitions.json's; each
// process logs in as its own (rabbitadmin). These checks keep the compose
// files and that file in step: a URL naming a user the broker does not
// have, or a password that is not the one whose hash the file holds, fails
// only at `docker compose up`, with ACCESS_REFUSED in a log.

// amqpUsers is the user each binary logs in as.
var amqpUsers = map[string]string{
	"outbox-relay":   rabbitadmin.RelayUser,
	"order-consumer": rabbitadmin.ConsumerUser,
	"orderctl":       rabbitadmin.OperatorUser,
	"walkthrough":    rabbitadmin.WalkthroughUser,
}

func readDefinitions(t *testing.T) rabbitadmin.Definitions {
	t.Helper()
	d, err := rabbitadmin.ReadDefinitions(filepath.Join(testenv.RepoRoot(t), rabbitadmin.DefinitionsFile))
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestComposeAMQPUsersMatchDefinitions(t *testing.T) {
	t.Parallel()
	d := readDefinitions(t)
	checkStacks(t, func(p *types.Project) []string { return amqpLoginProblems(p, d) })
}

func TestComposeBrokerImportsDefinitions(t *testing.T) {
	t.Parallel()
	checkStacks(t, definitionsMountProblems)
}

// amqpLoginProblems checks every AMQP_URL of the compose files against the
// definitions: the user of the binary the service runs, a password the
// user's hash is of, a vhost it has permissions in.
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
		password, _ := u.User.Password()
		vhost := "/"
		if len(u.Path) > 1 {
			vhost = u.Path[1:]
		}
		def, ok := d.User(user)
		switch {
		case known && user != want:
			problems = append(problems, fmt.Sprintf("service %s (%s) logs in as %s, want %s", name, entrypointBinary(svc), user, want))
		case !ok:
			problems = append(problems, fmt.Sprintf("service %s logs in as %s, a user %s does not have", name, user, rabbitadmin.DefinitionsFile))
		}
		if !ok {
			continue
		}
		if match, err := rabbitadmin.CheckPassword(def.PasswordHash, password); !match || err != nil {
			problems = append(problems, fmt.Sprintf("service %s: the password of %s in AMQP_URL is not the one whose hash %s holds", name, user, rabbitadmin.DefinitionsFile))
		}
		if _, ok := d.PermissionsOf(user, vhost); !ok {
			problems = append(problems, fmt.Sprintf("service %s: %s has no permissions in vhost %s", name, user, vhost))
		}
	}
	return problems
}

// definitionsMountProblems checks that the RabbitMQ service mounts the
// definitions file, and a configuration file in conf.d whose
// load_definitions names where it is mounted.
func definitionsMountProblems(p *types.Project) []string {
	var problems []string
	for _, name := range serviceNames(p) {
		svc := p.Services[name]
		if repo, _, _ := imageParts(svc.Image); repo != "rabbitmq" {
			continue
		}
		var definitions, conf string // where they are mounted
		var loads []string           // the load_definitions of the mounted conf.d files
		for _, v := range svc.Volumes {
			rel, err := filepath.Rel(p.WorkingDir, v.Source)
			if v.Type != types.VolumeTypeBind || err != nil {
				continue
			}
			switch {
			case filepath.ToSlash(rel) == rabbitadmin.DefinitionsFile:
				definitions = v.Target
			case strings.HasPrefix(v.Target, "/etc/rabbitmq/conf.d/") && strings.HasSuffix(v.Target, ".conf"):
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
		}
		switch {
		case definitions == "":
			problems = append(problems, fmt.Sprintf("service %s does not mount %s: the processes' users do not exist", name, rabbitadmin.DefinitionsFile))
		case conf == "":
			problems = append(problems, fmt.Sprintf("service %s mounts no .conf file into /etc/rabbitmq/conf.d/ to load_definitions", name))
		case len(loads) != 1 || loads[0] != definitions:
			problems = append(problems, fmt.Sprintf("service %s: the load_definitions of %s are %v, want %s", name, conf, loads, definitions))
		}
	}
	return problems
}

func TestAMQPLoginChecks(t *testing.T) {
	t.Parallel()
	d := readDefinitions(t)
	relay := func(amqpURL string) string {
		body := "services:\n  relay:\n    image: o:1\n    entrypoint: [/usr/local/bin/outbox-relay]\n"
		if amqpURL != "" {
			body += "    environment: {AMQP_URL: \"" + amqpURL + "\"}\n"
		}
		return body
	}
	tests := []struct {
		name, doc string
		want      []string
	}{
		{"its user", relay("amqp://orders-relay:orders-relay@rabbitmq:5672/"), nil},
		{"guest", relay("amqp://guest:guest@rabbitmq:5672/"), []string{"logs in as guest, want orders-relay"}},
		{"another process's user", relay("amqp://orders-consumer:orders-consumer@rabbitmq:5672/"), []string{"logs in as orders-consumer, want orders-relay"}},
		{"wrong password", relay("amqp://orders-relay:secret@rabbitmq:5672/"), []string{"is not the one whose hash"}},
		{"another vhost", relay("amqp://orders-relay:orders-relay@rabbitmq:5672/other"), []string{"has no permissions in vhost other"}},
		{"no AMQP_URL", relay(""), []string{"sets no AMQP_URL"}},
		{"the nodes of a cluster", relay("amqp://orders-relay:orders-relay@rabbitmq-1:5672/,amqp://orders-relay:orders-relay@rabbitmq-2:5672/"), nil},
		{"a cluster's nodes, another user on one", relay("amqp://orders-relay:orders-relay@rabbitmq-1:5672/,amqp://guest:guest@rabbitmq-2:5672/"),
			[]string{"URL 2 of 2 differs from the first"}},
		{"a cluster's nodes, all another user", relay("amqp://guest:guest@rabbitmq-1:5672/,amqp://guest:guest@rabbitmq-2:5672/"), []string{"logs in as guest"}},
		{"a tool as an unknown user", "services:\n  tool:\n    image: o:1\n    environment: {AMQP_URL: \"amqp://nobody:x@rabbitmq:5672/\"}\n", []string{"a user deploy/rabbitmq/definitions.json does not have"}},
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
	const conf = "load_definitions = /etc/rabbitmq/definitions.json\n"
	broker := func(volumes string) string {
		return "services:\n  mq:\n    image: rabbitmq:3.13.7-management-alpine\n    volumes: [" + volumes + "]\n"
	}
	tests := []struct {
		name, doc string
		files     map[string]string
		want      []string
	}{
		{"both", broker("./deploy/rabbitmq/definitions.json:/etc/rabbitmq/definitions.json:ro, ./d.conf:/etc/rabbitmq/conf.d/30-d.conf:ro"), map[string]string{"d.conf": conf}, nil},
		{"no definitions", broker("./d.conf:/etc/rabbitmq/conf.d/30-d.conf:ro"), map[string]string{"d.conf": conf}, []string{"does not mount deploy/rabbitmq/definitions.json"}},
		{"no conf", broker("./deploy/rabbitmq/definitions.json:/etc/rabbitmq/definitions.json:ro"), nil, []string{"mounts no .conf file"}},
		{"another path", broker("./deploy/rabbitmq/definitions.json:/defs.json:ro, ./d.conf:/etc/rabbitmq/conf.d/30-d.conf:ro"), map[string]string{"d.conf": conf}, []string{"want /defs.json"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			files := map[string]string{rabbitadmin.DefinitionsFile: "{}"}
			maps.Copy(files, tt.files)
			p, err := loadComposeDoc(t, tt.doc, files)
			if err != nil {
				t.Fatal(err)
			}
			wantProblems(t, definitionsMountProblems(p), tt.want)
		})
	}
}
