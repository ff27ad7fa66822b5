package deploy

import (
	"fmt"
	"net/url"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/types"

	"github.com/yourorg/orders/internal/composesecrets"
	"github.com/yourorg/orders/internal/config"
	"github.com/yourorg/orders/internal/rabbitadmin"
	"github.com/yourorg/orders/internal/testenv"
)

// The compose files hold no secret. A one-shot service (cmd/compose-secrets)
// makes the stack's own at its first start, in a volume, or takes them
// from .env; every service reads its secrets from files there; so a team
// that deploys the files unchanged never runs with the repository's
// credentials, and `docker compose up` on a fresh clone still needs
// nothing else. These checks keep it so.

// secretsMaker returns the service that runs compose-secrets.
func secretsMaker(p *types.Project) (types.ServiceConfig, bool) {
	for _, name := range serviceNames(p) {
		if svc := p.Services[name]; entrypointBinary(svc) == "compose-secrets" {
			return svc, true
		}
	}
	return types.ServiceConfig{}, false
}

// secretsMount is the volume a service mounts at composesecrets.Dir.
func secretsMount(svc types.ServiceConfig) (types.ServiceVolumeConfig, bool) {
	i := slices.IndexFunc(svc.Volumes, func(v types.ServiceVolumeConfig) bool { return v.Target == composesecrets.Dir })
	if i < 0 {
		return types.ServiceVolumeConfig{}, false
	}
	return svc.Volumes[i], true
}

// secretFiles are the files of the secrets directory a service may name.
func secretFiles() []string {
	files := []string{composesecrets.RabbitMQDefinitions}
	for _, s := range composesecrets.Secrets {
		files = append(files, s.File)
	}
	return files
}

// isFileVariable tells a variable that names a file: the binaries'
// *_FILE, the postgres image's *_FILE, Grafana's *__FILE.
func isFileVariable(name string) bool { return strings.HasSuffix(name, "_FILE") }

// secretsProblems: a one-shot service makes the secrets in a named volume,
// taking each from its .env variable when set; every file variable of
// every service names a secret of that volume, which the service mounts
// read-only and waits for.
func secretsProblems(p *types.Project) []string {
	maker, ok := secretsMaker(p)
	if !ok {
		return []string{"no service runs compose-secrets: the stack's secrets are made nowhere"}
	}
	var problems []string
	volume, ok := secretsMount(maker)
	switch {
	case !ok || volume.Type == types.VolumeTypeBind || volume.Source == "":
		return append(problems, fmt.Sprintf("service %s mounts no named volume at %s: its secrets would be lost, or nobody could read them", maker.Name, composesecrets.Dir))
	case volume.ReadOnly:
		problems = append(problems, fmt.Sprintf("service %s mounts %s read-only: it cannot write the secrets", maker.Name, composesecrets.Dir))
	}
	if !oneShot(maker) {
		problems = append(problems, fmt.Sprintf("service %s restarts (%s): it must be one-shot", maker.Name, restartPolicy(maker)))
	}
	for _, s := range composesecrets.Secrets {
		if v := maker.Environment[s.Variable]; v == nil {
			problems = append(problems, fmt.Sprintf("service %s does not pass %s from .env: that secret cannot be set there", maker.Name, s.Variable))
		}
	}
	for _, name := range serviceNames(p) {
		svc := p.Services[name]
		if name == maker.Name {
			continue
		}
		reads := false
		for _, variable := range slices.Sorted(func(yield func(string) bool) {
			for k := range svc.Environment {
				if !yield(k) {
					return
				}
			}
		}) {
			value := envValue(svc, variable)
			if !isFileVariable(variable) || value == "" {
				continue
			}
			reads = true
			dir, file := path.Split(value)
			if path.Clean(dir) != composesecrets.Dir || !slices.Contains(secretFiles(), file) {
				problems = append(problems, fmt.Sprintf("service %s: %s=%s is not a secret of %s (%v)", name, variable, value, composesecrets.Dir, secretFiles()))
			}
		}
		if !reads {
			continue
		}
		if m, ok := secretsMount(svc); !ok || m.Source != volume.Source || !m.ReadOnly {
			problems = append(problems, fmt.Sprintf("service %s reads secrets but does not mount volume %s at %s read-only", name, volume.Source, composesecrets.Dir))
		}
		// A tool of a profile that depends on nothing (orderctl) runs
		// against the stack `up` started, whose secrets exist by then
		// (TestComposeOrderctlStartsNothing).
		tool := len(svc.Profiles) > 0 && len(svc.DependsOn) == 0
		if !tool && !waitsFor(p, svc, maker.Name, map[string]bool{}) {
			problems = append(problems, fmt.Sprintf("service %s reads secrets but does not wait for service %s to complete", name, maker.Name))
		}
	}
	return problems
}

// waitsFor tells whether svc starts only once service one-shot has
// completed: it depends on it so, or on a service that does (a dependency
// starts only once its own dependencies' conditions hold).
func waitsFor(p *types.Project, svc types.ServiceConfig, oneShot string, seen map[string]bool) bool {
	for dep, cfg := range svc.DependsOn {
		if dep == oneShot && cfg.Condition == types.ServiceConditionCompletedSuccessfully {
			return true
		}
		if d, ok := p.Services[dep]; ok && !seen[dep] {
			seen[dep] = true
			if waitsFor(p, d, oneShot, seen) {
				return true
			}
		}
	}
	return false
}

// secretName tells a variable that holds a secret by its name.
func secretName(variable string) bool {
	for _, part := range []string{"PASSWORD", "SECRET", "TOKEN"} {
		if strings.Contains(variable, part) {
			return true
		}
	}
	return false
}

// repositorySecretProblems: no environment value of any service holds a
// secret, or a credential the repository publishes (the binaries would
// refuse it anyway, the servers would not); and nothing runs in
// development, which would let those in.
func repositorySecretProblems(p *types.Project) []string {
	var problems []string
	for _, name := range serviceNames(p) {
		svc := p.Services[name]
		for variable, v := range svc.Environment {
			if v == nil || *v == "" {
				continue
			}
			value := *v
			switch u, err := url.Parse(value); {
			case secretName(variable) && config.DevelopmentCredential(value):
				problems = append(problems, fmt.Sprintf("service %s: %s is a development credential of the repository", name, variable))
			case err == nil && u.User != nil && u.Scheme != "http" && u.Scheme != "https":
				if _, has := u.User.Password(); has {
					problems = append(problems, fmt.Sprintf("service %s: %s carries a password: give it in a file of the secrets volume", name, variable))
				}
			case variable == "DEV_MODE" && value != "false" && value != "0":
				problems = append(problems, fmt.Sprintf("service %s runs in development (DEV_MODE): it would take the repository's credentials", name))
			}
			if secretName(variable) && !isFileVariable(variable) {
				problems = append(problems, fmt.Sprintf("service %s: %s is set in the file: give it in a file of the secrets volume", name, variable))
			}
		}
	}
	return problems
}

func TestComposeSecretsAreTheStacksOwn(t *testing.T) {
	t.Parallel()
	checkStacks(t, secretsProblems)
	checkStacks(t, repositorySecretProblems)
	// The loader read no .env: with nothing set, the maker passes each
	// variable on empty, and generates the secret.
	for _, files := range stacks {
		maker, _ := secretsMaker(testenv.Compose(t, files...))
		for _, s := range composesecrets.Secrets {
			if v := envValue(maker, s.Variable); v != "" {
				t.Errorf("%s: the secrets service sets %s to %q when .env does not", strings.Join(files, " + "), s.Variable, v)
			}
		}
	}
}

// renderedDefinitions are the RabbitMQ definitions the secrets service
// renders: the repository's files its -definitions names, through its bind
// mounts.
func renderedDefinitions(p *types.Project) (rabbitadmin.Definitions, error) {
	maker, ok := secretsMaker(p)
	if !ok {
		return rabbitadmin.Definitions{}, fmt.Errorf("no service runs compose-secrets")
	}
	i := slices.Index(maker.Command, "-definitions")
	if i < 0 || i+1 >= len(maker.Command) {
		return rabbitadmin.Definitions{}, fmt.Errorf("service %s names no -definitions", maker.Name)
	}
	var files []string
	for _, inContainer := range strings.Split(maker.Command[i+1], ",") {
		host := ""
		for _, v := range maker.Volumes {
			if rel, err := filepath.Rel(v.Target, inContainer); v.Type == types.VolumeTypeBind && err == nil && filepath.IsLocal(rel) {
				host = filepath.Join(v.Source, rel)
			}
		}
		if host == "" {
			return rabbitadmin.Definitions{}, fmt.Errorf("service %s: %s is in no bind mount", maker.Name, inContainer)
		}
		files = append(files, host)
	}
	return rabbitadmin.ReadDefinitions(files...)
}

func TestSecretsChecks(t *testing.T) {
	t.Parallel()
	maker := func(more string) string {
		body := "  secrets:\n    image: o:1\n    entrypoint: [/usr/local/bin/compose-secrets]\n    restart: \"no\"\n    volumes: [\"keys:/run/orders-secrets\"]\n    environment:\n"
		for _, s := range composesecrets.Secrets {
			body += "      " + s.Variable + ": ${" + s.Variable + ":-}\n"
		}
		return body + more
	}
	api := func(env, volumes, deps string) string {
		return "  api:\n    image: o:1\n    entrypoint: [/usr/local/bin/order-api]\n    environment: {" + env + "}\n" + volumes + deps
	}
	const ro, waits = "    volumes: [\"keys:/run/orders-secrets:ro\"]\n", "    depends_on: {secrets: {condition: service_completed_successfully}}\n"
	const vol = "volumes:\n  keys:\n"
	tests := []struct {
		name, doc string
		check     func(*types.Project) []string
		want      []string
	}{
		{"made and read", "services:\n" + maker("") + api("DATABASE_PASSWORD_FILE: /run/orders-secrets/db-orders_api", ro, waits) + vol, secretsProblems, nil},
		{"no maker", "services:\n" + api("", "", ""), secretsProblems, []string{"no service runs compose-secrets"}},
		{"a bind mount", "services:\n  secrets:\n    image: o:1\n    entrypoint: [/usr/local/bin/compose-secrets]\n    volumes: [\"./s:/run/orders-secrets\"]\n", secretsProblems, []string{"mounts no named volume"}},
		{"a variable not passed", "services:\n" + strings.Replace(maker(""), "      ORDERS_API_JWT_SECRET: ${ORDERS_API_JWT_SECRET:-}\n", "", 1) + vol, secretsProblems, []string{"does not pass ORDERS_API_JWT_SECRET"}},
		{"a file elsewhere", "services:\n" + maker("") + api("API_JWT_SECRET_FILE: /etc/jwt", ro, waits) + vol, secretsProblems, []string{"API_JWT_SECRET_FILE=/etc/jwt is not a secret"}},
		{"not mounted", "services:\n" + maker("") + api("API_JWT_SECRET_FILE: /run/orders-secrets/api-jwt-secret", "", waits) + vol, secretsProblems, []string{"does not mount volume"}},
		{"mounted read-write", "services:\n" + maker("") + api("API_JWT_SECRET_FILE: /run/orders-secrets/api-jwt-secret", "    volumes: [\"keys:/run/orders-secrets\"]\n", waits) + vol, secretsProblems, []string{"does not mount volume"}},
		{"not waited for", "services:\n" + maker("") + api("API_JWT_SECRET_FILE: /run/orders-secrets/api-jwt-secret", ro, "") + vol, secretsProblems, []string{"does not wait for service secrets"}},
		{"the development JWT secret", "services:\n" + api("API_JWT_SECRET: "+config.DevelopmentJWTSecret, "", ""), repositorySecretProblems, []string{"API_JWT_SECRET is a development credential", "API_JWT_SECRET is set in the file"}},
		{"a password in a URL", "services:\n" + api(`AMQP_URL: "amqp://orders-relay:s3cret@mq/"`, "", ""), repositorySecretProblems, []string{"AMQP_URL carries a password"}},
		{"a development password", "services:\n  db:\n    image: postgres:15.8\n    environment: {POSTGRES_PASSWORD: postgres}\n", repositorySecretProblems, []string{"POSTGRES_PASSWORD is a development credential", "POSTGRES_PASSWORD is set in the file"}},
		{"a password default", "services:\n  g:\n    image: grafana/grafana:11.3.1\n    environment: {GF_SECURITY_ADMIN_PASSWORD: \"${PW:-admin}\"}\n", repositorySecretProblems, []string{"GF_SECURITY_ADMIN_PASSWORD is set in the file"}},
		{"development", "services:\n" + api(`DEV_MODE: "true"`, "", ""), repositorySecretProblems, []string{"runs in development"}},
		{"files and URLs without passwords", "services:\n" + api(`DATABASE_URL: "postgres://orders_api@db/orders", DATABASE_PASSWORD_FILE: /run/orders-secrets/db-orders_api, JAEGER_UI_URL: "http://localhost:16686"`, "", ""), repositorySecretProblems, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p, err := loadComposeDoc(t, tt.doc, nil)
			if err != nil {
				t.Fatalf("load: %v\n%s", err, tt.doc)
			}
			wantProblems(t, tt.check(p), tt.want)
		})
	}
}
