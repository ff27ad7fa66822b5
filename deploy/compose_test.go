package deploy

import (
	"cmp"
	"errors"
	"fmt"
	"go/parser"
	"go/token"
	"maps"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/loader"
	"github.com/compose-spec/compose-go/v2/types"

	"github.com/yourorg/orders/internal/testenv"
)

// There is no Docker engine where these tests run, so docker-compose.yml is
// checked the way docker compose would read it (testenv.Compose) and then
// against the mistakes that only show up at `docker compose up`: a check is
// a function from the project to a list of problems, run on the real file by
// one test and on small inline documents by TestComposeChecks, which proves
// that each check can fail.

// schemaBinaries are the commands that need the schema, and so also have
// the `migrate` sub-command (docs/contract.md, "Configuration").
var schemaBinaries = []string{"order-api", "outbox-relay", "order-consumer"}

// stacks are the ways the compose files are used: the stack alone, with
// the demo override (the walkthrough, the fault endpoint), with the
// cluster override (three RabbitMQ nodes), with both, and with the HA
// override (PostgreSQL under Patroni), with or without the cluster's.
// Every check that holds for one holds for all.
var stacks = [][]string{
	{testenv.ComposeFile},
	{testenv.ComposeFile, testenv.DemoComposeFile},
	{testenv.ComposeFile, testenv.ClusterComposeFile},
	{testenv.ComposeFile, testenv.ClusterComposeFile, testenv.DemoComposeFile},
	{testenv.ComposeFile, testenv.HAComposeFile},
	{testenv.ComposeFile, testenv.ClusterComposeFile, testenv.HAComposeFile},
}

// checkStacks runs check on every stack and reports its problems, each
// with the files it was found in.
func checkStacks(t *testing.T, check func(*types.Project) []string) {
	t.Helper()
	for _, files := range stacks {
		for _, problem := range check(testenv.Compose(t, files...)) {
			t.Errorf("%s: %s", strings.Join(files, " + "), problem)
		}
	}
}

func TestComposeImagesNameAVersion(t *testing.T) {
	t.Parallel()
	checkStacks(t, unversionedImages)
}

func TestComposeDependenciesCanBeMet(t *testing.T) {
	t.Parallel()
	checkStacks(t, dependencyProblems)
}

func TestComposeHostPathsExist(t *testing.T) {
	t.Parallel()
	checkStacks(t, missingHostPaths)
}

func TestComposeHostPortsAreUnique(t *testing.T) {
	t.Parallel()
	checkStacks(t, hostPortProblems)
}

// Every published host port moves with a variable, and each variable is
// documented where a user looks for it: the configuration page and
// .env.example, the file compose reads them from once copied to .env.
func TestComposeHostPortsAreSettable(t *testing.T) {
	t.Parallel()
	for _, files := range stacks {
		lookup := newPortLookup()
		moved, err := testenv.LoadCompose(t, []cli.ProjectOptionsFn{lookup.option()}, files...)
		if err != nil {
			t.Fatal(err)
		}
		for _, problem := range fixedHostPorts(testenv.Compose(t, files...), moved) {
			t.Errorf("%s: %s", strings.Join(files, " + "), problem)
		}
		if len(lookup.values) == 0 {
			t.Errorf("%s: no variable ending in _PORT is read", strings.Join(files, " + "))
		}
		for _, doc := range []string{testenv.ConfigurationPage, ".env.example"} {
			text := readRepoFile(t, doc)
			for _, name := range slices.Sorted(maps.Keys(lookup.values)) {
				if !strings.Contains(text, name) {
					t.Errorf("%s does not document %s, a host port of %s", doc, name, strings.Join(files, " + "))
				}
			}
		}
	}
}

// The stack runs as production does: two relays and two consumer
// processes, which keep one order's messages in order across them (the
// demo runs one consumer, for its crash).
func TestComposeRunsTwoRelaysAndTwoConsumers(t *testing.T) {
	t.Parallel()
	p := testenv.Compose(t, "docker-compose.yml")
	for _, binary := range []string{"outbox-relay", "order-consumer"} {
		if got := instances(servers(p, binary)); got != 2 {
			t.Errorf("docker-compose.yml runs %d %s, want 2", got, binary)
		}
	}
}

func TestComposePostgresHealthcheckUsesTCP(t *testing.T) {
	t.Parallel()
	checkStacks(t, postgresHealthcheckProblems)
}

func TestComposeRunsTheWholeStack(t *testing.T) {
	t.Parallel()
	checkStacks(t, missingServices)
}

func TestComposeBuiltServicesRunRepositoryBinaries(t *testing.T) {
	t.Parallel()
	binaries := commandNames(repoCommands(t))
	checkStacks(t, func(p *types.Project) []string { return builtServiceProblems(p, binaries) })
}

// `docker compose up --wait` returns once every container is healthy:
// only a health check that asks the process whether it is ready makes that
// mean the API answers, the consumers consume and the relays publish.
func TestComposeServersHaveHealthchecks(t *testing.T) {
	t.Parallel()
	checkStacks(t, serverHealthcheckProblems)
}

func TestComposeBuildsTheImageOnce(t *testing.T) {
	t.Parallel()
	checkStacks(t, repeatedBuilds)
}

func TestComposePublishesNoAdminPort(t *testing.T) {
	t.Parallel()
	checkStacks(t, publishedAdminPorts)
}

func TestComposeGrafanaHasNoAnonymousAdmin(t *testing.T) {
	t.Parallel()
	checkStacks(t, grafanaAnonymousRole)
}

// The broker keeps its queues and messages when compose recreates it.
func TestComposeBrokerKeepsItsNodeName(t *testing.T) {
	t.Parallel()
	checkStacks(t, brokerNodeNameProblems)
}

// The relays, the consumers and orderctl agree on the partitions, in every
// stack.
func TestComposePartitionsAgree(t *testing.T) {
	t.Parallel()
	checkStacks(t, partitionProblems)
}

// The fault endpoint is off in the stack, and on in the demo, where the
// walkthrough reaches it inside the compose network.
func TestComposeFaultEndpointOnlyInTheDemo(t *testing.T) {
	t.Parallel()
	reportProblems(t, faultEndpointsOn(testenv.Compose(t, testenv.ComposeFile)))
	reportProblems(t, demoProblems(testenv.Compose(t, testenv.ComposeFile, testenv.DemoComposeFile)))
}

func reportProblems(t *testing.T, problems []string) {
	t.Helper()
	for _, p := range problems {
		t.Error(p)
	}
}

// serviceNames returns the services in name order: Project.Services is a
// map, and the same file should fail with the same messages every run.
func serviceNames(p *types.Project) []string {
	return slices.Sorted(maps.Keys(p.Services))
}

// imageParts splits an image reference into repository, tag and digest. The
// tag's colon is the last one after the last slash, since a registry may
// carry a port (localhost:5000/orders has no tag).
func imageParts(image string) (repo, tag, digest string) {
	repo, digest, _ = strings.Cut(image, "@")
	slash := strings.LastIndex(repo, "/")
	if i := strings.LastIndex(repo, ":"); i > slash {
		repo, tag = repo[:i], repo[i+1:]
	}
	return repo, tag, digest
}

// versionedTag matches a tag that names a release: a number at its start or
// after a dash (15.8-alpine, v2.55.1, 3.13-management). alpine3.20 does not:
// that versions the base distribution, not the software.
var versionedTag = regexp.MustCompile(`(^|[-_])v?[0-9]`)

// unversionedImages lists the services whose pulled image can change
// under the walkthrough: no tag (latest), latest, or a tag such as alpine or
// management that names no version brings another server version the next
// time someone pulls. A tag that names a version is not a pin either (a
// registry may move it, to a rebuild with security fixes, say): only a
// digest is. The file names versions and no digests, because digests can
// only be read from the registries; a team that wants pins adds
// @sha256:... to each image and a bot to update them. The image the file
// builds itself is named, not pulled.
func unversionedImages(p *types.Project) []string {
	var problems []string
	for _, name := range serviceNames(p) {
		svc := p.Services[name]
		if svc.Build != nil || builtImage(p, svc.Image) {
			continue
		}
		_, tag, digest := imageParts(svc.Image)
		switch {
		case digest != "":
		case tag == "":
			problems = append(problems, fmt.Sprintf("service %s: image %q has no tag, which means latest: name a version", name, svc.Image))
		case tag == "latest":
			problems = append(problems, fmt.Sprintf("service %s: image %q: latest moves, name a version", name, svc.Image))
		case !versionedTag.MatchString(tag):
			problems = append(problems, fmt.Sprintf("service %s: image %q: tag %q names no version, so it moves", name, svc.Image, tag))
		}
	}
	return problems
}

// builtImage tells whether some service of the project builds image.
func builtImage(p *types.Project, image string) bool {
	for _, svc := range p.Services {
		if svc.Build != nil && image != "" && svc.Image == image {
			return true
		}
	}
	return false
}

// hasHealthcheck tells whether compose itself defines a health test for
// the service. An image may bring a HEALTHCHECK of its own, but the file
// cannot show it, and the official postgres and rabbitmq images have none.
func hasHealthcheck(svc types.ServiceConfig) bool {
	hc := svc.HealthCheck
	return hc != nil && !hc.Disable && len(hc.Test) > 0 && hc.Test[0] != "NONE"
}

// healthcheckHosts finds the host a PostgreSQL client connects to in a
// command line: pg_isready's or psql's -h or --host, host= in a
// connection string, or the host of a postgres:// URL (empty there: the
// socket).
var healthcheckHosts = regexp.MustCompile(`(?:^|\s)(?:-h\s*|--host[=\s]\s*)["']?([^\s"']+)|\bhost=["']?([^\s"']+)|postgres(?:ql)?://(?:[^@/\s]*@)?([^/:?\s]*)`)

// postgresHealthcheckProblems lists the PostgreSQL services whose health
// check would pass on the Unix socket. On its first start the official
// image runs the server on the socket only while it initialises the
// database, then restarts it: a socket check reports healthy in between,
// and the services that waited for it connect over TCP to a server that
// is not listening. The check must use TCP, as they do.
func postgresHealthcheckProblems(p *types.Project) []string {
	var problems []string
	for _, name := range serviceNames(p) {
		svc := p.Services[name]
		repo, _, _ := imageParts(svc.Image)
		if n := path.Base(repo); (n != "postgres" && n != "postgresql") || !hasHealthcheck(svc) {
			continue // missingServices reports a missing check
		}
		command := strings.Join(svc.HealthCheck.Test[1:], " ")
		tcp := false
		for _, m := range healthcheckHosts.FindAllStringSubmatch(command, -1) {
			host := m[1] + m[2] + m[3]
			tcp = tcp || host != "" && !strings.HasPrefix(host, "/")
		}
		if !tcp {
			problems = append(problems, fmt.Sprintf("service %s: the health check %q connects over the Unix socket, healthy before the server listens on TCP: name the host the way the services connect (pg_isready -h 127.0.0.1)", name, command))
		}
	}
	return problems
}

// restartPolicy is the policy the service's container runs with: `restart`,
// or else deploy.restart_policy, whose condition defaults to any.
func restartPolicy(svc types.ServiceConfig) string {
	switch {
	case svc.Restart != "":
		return svc.Restart
	case svc.Deploy != nil && svc.Deploy.RestartPolicy != nil:
		if c := svc.Deploy.RestartPolicy.Condition; c != "" {
			return "deploy.restart_policy " + c
		}
		return "deploy.restart_policy any"
	}
	return types.RestartPolicyNo
}

// oneShot tells whether the service runs once and stays exited.
func oneShot(svc types.ServiceConfig) bool {
	switch restartPolicy(svc) {
	case types.RestartPolicyNo, "deploy.restart_policy none":
		return true
	}
	return false
}

// dependencyProblems lists the depends_on conditions that cannot be met.
// docker compose refuses to start a service waiting for a dependency to be
// healthy when that dependency has no healthcheck; and a dependency meant to
// complete that restarts after exiting (unless-stopped, the app default)
// runs again and again, a migration in a loop.
func dependencyProblems(p *types.Project) []string {
	var problems []string
	for _, name := range serviceNames(p) {
		deps := p.Services[name].DependsOn
		for _, dep := range slices.Sorted(maps.Keys(deps)) {
			cond := deps[dep].Condition
			svc, ok := p.Services[dep]
			if _, disabled := p.DisabledServices[dep]; !ok && disabled && !deps[dep].Required {
				continue // an optional dependency in a profile that is off
			}
			switch {
			case !ok:
				problems = append(problems, fmt.Sprintf("service %s depends on %s, which is not a service", name, dep))
			case cond == types.ServiceConditionHealthy && !hasHealthcheck(svc):
				problems = append(problems, fmt.Sprintf("service %s waits for %s to be healthy, but %s has no healthcheck (or it is disabled)", name, dep, dep))
			case cond == types.ServiceConditionCompletedSuccessfully && !oneShot(svc):
				problems = append(problems, fmt.Sprintf("service %s waits for %s to complete, but %s restarts (%s): it must be one-shot (restart \"no\" or unset)", name, dep, dep, restartPolicy(svc)))
			}
		}
	}
	return problems
}

// dockerfileOf is the absolute path of the Dockerfile a build section uses,
// or "" for an inline Dockerfile or a remote context.
func dockerfileOf(b *types.BuildConfig) string {
	if b.DockerfileInline != "" || !filepath.IsAbs(b.Context) {
		return ""
	}
	if filepath.IsAbs(b.Dockerfile) {
		return b.Dockerfile
	}
	return filepath.Join(b.Context, cmp.Or(b.Dockerfile, "Dockerfile"))
}

// missingHostPaths lists the host paths compose reads that a fresh clone of
// the repository does not have. Docker creates a missing bind-mount source
// as an empty directory, so Prometheus or Grafana would start with no
// configuration and say nothing; a path outside the repository exists on
// one machine only. The loader has already resolved every path against the
// repository root (and rejected a missing env_file it had to read).
func missingHostPaths(p *types.Project) []string {
	var problems []string
	check := func(what, hostPath string) {
		rel, err := filepath.Rel(p.WorkingDir, hostPath)
		switch {
		case err != nil || !filepath.IsLocal(rel):
			problems = append(problems, fmt.Sprintf("%s: %s is outside the repository", what, hostPath))
		default:
			if _, err := os.Stat(hostPath); err != nil {
				problems = append(problems, fmt.Sprintf("%s: %s does not exist in the repository", what, rel))
			}
		}
	}
	for _, name := range serviceNames(p) {
		svc := p.Services[name]
		for _, v := range svc.Volumes {
			if v.Type == types.VolumeTypeBind {
				check(fmt.Sprintf("service %s: bind mount on %s", name, v.Target), v.Source)
			}
		}
		for _, f := range svc.EnvFiles {
			// `required: false` says the file is optional (a developer's
			// local, git-ignored overrides).
			if f.Required {
				check(fmt.Sprintf("service %s: env_file", name), f.Path)
			}
		}
		if svc.Build != nil && filepath.IsAbs(svc.Build.Context) {
			check(fmt.Sprintf("service %s: build context", name), svc.Build.Context)
			if df := dockerfileOf(svc.Build); df != "" {
				check(fmt.Sprintf("service %s: build dockerfile", name), df)
			}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(p.Configs)) {
		if file := p.Configs[name].File; file != "" {
			check(fmt.Sprintf("configs.%s", name), file)
		}
	}
	return problems
}

// hostBinding is one host port a service asks for.
type hostBinding struct {
	service, ip string
}

// anyAddress tells whether a host IP binds every address, and so conflicts
// with a binding of the same port on any one address.
func anyAddress(ip string) bool {
	return ip == "" || ip == "0.0.0.0" || ip == "::"
}

// portRange parses a published port, "8080" or "8000-8001".
func portRange(published string) (lo, hi int, err error) {
	first, last, isRange := strings.Cut(published, "-")
	if lo, err = strconv.Atoi(first); err != nil {
		return 0, 0, err
	}
	hi = lo
	if isRange {
		if hi, err = strconv.Atoi(last); err != nil {
			return 0, 0, err
		}
	}
	return lo, hi, nil
}

// hostPortProblems lists host ports that more than one container would
// bind: `docker compose up` then stops half way with "port is already
// allocated". A service with replicas gets one container per replica, so a
// fixed host port (or a range shorter than the replicas) conflicts with
// itself; such a service publishes no host port, or an ephemeral one.
func hostPortProblems(p *types.Project) []string {
	var problems []string
	bound := map[string][]hostBinding{} // "8080/tcp" -> bindings
	for _, name := range serviceNames(p) {
		svc := p.Services[name]
		replicas := svc.GetScale()
		for _, port := range svc.Ports {
			if port.Published == "" {
				continue // an ephemeral host port: never a conflict
			}
			lo, hi, err := portRange(port.Published)
			if err != nil {
				problems = append(problems, fmt.Sprintf("service %s: published port %q: %v", name, port.Published, err))
				continue
			}
			if replicas > 1 && hi-lo+1 < replicas {
				problems = append(problems, fmt.Sprintf("service %s has %d replicas but publishes host port %s: only one container can bind it (publish none, or let Docker pick)", name, replicas, port.Published))
			}
			for n := lo; n <= hi; n++ {
				key := fmt.Sprintf("%d/%s", n, cmp.Or(port.Protocol, "tcp"))
				for _, other := range bound[key] {
					if other.ip == port.HostIP || anyAddress(other.ip) || anyAddress(port.HostIP) {
						problems = append(problems, fmt.Sprintf("host port %s is published by both service %s and service %s", key, other.service, name))
					}
				}
				bound[key] = append(bound[key], hostBinding{service: name, ip: port.HostIP})
			}
		}
	}
	return problems
}

// entrypointBinary is the program a service's entrypoint runs, as
// testenv.ComposeServicesOf names it.
func entrypointBinary(svc types.ServiceConfig) string {
	if len(svc.Entrypoint) == 0 {
		return ""
	}
	return filepath.Base(svc.Entrypoint[0])
}

// isMigrationStep tells whether the service applies the schema: one of the
// binaries' `migrate` sub-command.
func isMigrationStep(svc types.ServiceConfig) bool {
	return slices.Contains(schemaBinaries, entrypointBinary(svc)) &&
		len(svc.Command) > 0 && svc.Command[0] == "migrate"
}

// instances counts the containers of services, replicas included.
func instances(services []types.ServiceConfig) int {
	n := 0
	for _, svc := range services {
		n += svc.GetScale()
	}
	return n
}

// servicesWhere returns the services that match, in name order.
func servicesWhere(p *types.Project, match func(types.ServiceConfig) bool) []types.ServiceConfig {
	var out []types.ServiceConfig
	for _, name := range serviceNames(p) {
		if svc := p.Services[name]; match(svc) {
			out = append(out, svc)
		}
	}
	return out
}

// servers returns the long-running services of one of this repository's
// binaries: the migration step runs the same binary but is not one of them.
func servers(p *types.Project, binary string) []types.ServiceConfig {
	return slices.DeleteFunc(testenv.ComposeServicesOf(p, binary), isMigrationStep)
}

// missingServices lists what the walkthrough needs that the file does not
// run. Services are found by image or by the binary they run, never by
// their name, so renaming a service does not hide or break anything.
func missingServices(p *types.Project) []string {
	var problems []string
	require := func(what string, found []types.ServiceConfig, want int) {
		if got := instances(found); got < want {
			problems = append(problems, fmt.Sprintf("%s: %d running, want at least %d", what, got, want))
		}
	}
	requireHealthcheck := func(what string, found []types.ServiceConfig) {
		for _, svc := range found {
			if !hasHealthcheck(svc) {
				problems = append(problems, fmt.Sprintf("service %s (%s) has no healthcheck: the services that need it cannot wait until it accepts connections", svc.Name, what))
			}
		}
	}
	// match sees the image's repository (jaegertracing/all-in-one) and its
	// last part (all-in-one).
	byImage := func(match func(repo, name string) bool) []types.ServiceConfig {
		return servicesWhere(p, func(svc types.ServiceConfig) bool {
			repo, _, _ := imageParts(svc.Image)
			return match(repo, path.Base(repo))
		})
	}

	postgres := byImage(func(_, n string) bool { return n == "postgres" || n == "postgresql" })
	require("PostgreSQL (image postgres)", postgres, 1)
	requireHealthcheck("PostgreSQL", postgres)

	rabbit := byImage(func(_, n string) bool { return n == "rabbitmq" })
	require("RabbitMQ (image rabbitmq)", rabbit, 1)
	requireHealthcheck("RabbitMQ", rabbit)
	for _, svc := range rabbit {
		// The walkthrough shows queues, the parking lot and redeliveries in
		// the management UI.
		if _, tag, _ := imageParts(svc.Image); !strings.Contains(tag, "management") {
			problems = append(problems, fmt.Sprintf("service %s: image %q has no management UI (use a *-management tag)", svc.Name, svc.Image))
		}
	}

	migrations := servicesWhere(p, isMigrationStep)
	require("a migration step (a service running `<binary> migrate`)", migrations, 1)
	for _, svc := range migrations {
		if !oneShot(svc) {
			problems = append(problems, fmt.Sprintf("service %s runs the migrations but restarts (%s): it must be one-shot", svc.Name, restartPolicy(svc)))
		}
	}

	require("order-api", servers(p, "order-api"), 1)
	// Two relays show FOR UPDATE SKIP LOCKED sharing the outbox.
	require("outbox-relay replicas", servers(p, "outbox-relay"), 2)
	require("order-consumer", servers(p, "order-consumer"), 1)
	require("webhook-receiver", servers(p, "webhook-receiver"), 1)
	require("Jaeger (image jaegertracing/*)", byImage(func(repo, _ string) bool { return strings.Contains(repo, "jaeger") }), 1)
	require("Prometheus (image prom/prometheus)", byImage(func(_, n string) bool { return n == "prometheus" }), 1)
	require("Grafana (image grafana/grafana*)", byImage(func(_, n string) bool { return strings.HasPrefix(n, "grafana") }), 1)
	return problems
}

// migratesOnStart tells whether the service applies the schema itself at
// start (under goose's advisory lock; docs/contract.md, "Configuration").
func migratesOnStart(svc types.ServiceConfig) bool {
	if v := svc.Environment["MIGRATE_ON_START"]; v != nil {
		if on, err := strconv.ParseBool(*v); err == nil && on {
			return true
		}
	}
	return slices.Contains(svc.Command, "-migrate") || slices.Contains(svc.Command, "--migrate")
}

// waitsForMigration tells whether the service starts only once a migration
// step has exited successfully.
func waitsForMigration(p *types.Project, svc types.ServiceConfig) bool {
	for dep, cfg := range svc.DependsOn {
		if cfg.Condition == types.ServiceConditionCompletedSuccessfully && isMigrationStep(p.Services[dep]) {
			return true
		}
	}
	return false
}

// builtServiceProblems checks the services that run the image of this
// repository's Dockerfile; binaries are the names of the commands of cmd/
// and lab/. The image holds every binary, so the entrypoint is what says
// which one a service runs: without it the service runs the image's
// default silently, and the tests that find services by entrypoint
// (testenv.ComposeServicesOf, the environment checks of cmd/*/ and lab/*/
// main_test.go) skip it. A binary that needs the schema must not start
// before it exists.
func builtServiceProblems(p *types.Project, binaries []string) []string {
	var problems []string
	for _, name := range serviceNames(p) {
		svc := p.Services[name]
		if !runsRepositoryImage(p, svc) {
			continue
		}
		binary := entrypointBinary(svc)
		switch {
		case binary == "":
			problems = append(problems, fmt.Sprintf("service %s runs the image of the Dockerfile but sets no entrypoint: name the binary it runs (one of %v)", name, binaries))
		case !slices.Contains(binaries, binary):
			problems = append(problems, fmt.Sprintf("service %s: entrypoint %q is not a command of cmd/ or lab/ (%v)", name, svc.Entrypoint[0], binaries))
		}
		if slices.Contains(schemaBinaries, binary) && !isMigrationStep(svc) && !waitsForMigration(p, svc) && !migratesOnStart(svc) {
			problems = append(problems, fmt.Sprintf("service %s may start %s before the schema exists: depend on the migration step with condition service_completed_successfully, or set MIGRATE_ON_START=true", name, binary))
		}
	}
	return problems
}

// serverHealthcheckProblems lists the long-running services of the
// repository's image whose readiness docker compose cannot see: each must
// have a health check that runs its own binary's healthcheck sub-command
// (the image is distroless: no shell, no curl), which asks the process's
// /readyz. The services that say they run once (restart "no": migrate,
// orderctl, the walkthrough) have none: compose waits for them to
// complete. A service that says nothing restarts no more, but is a server
// all the same.
func serverHealthcheckProblems(p *types.Project) []string {
	var problems []string
	for _, name := range serviceNames(p) {
		svc := p.Services[name]
		runsOnce := svc.Restart == types.RestartPolicyNo || restartPolicy(svc) == "deploy.restart_policy none"
		if !runsRepositoryImage(p, svc) || runsOnce || len(svc.Entrypoint) == 0 {
			continue
		}
		want := []string{"CMD", svc.Entrypoint[0], "healthcheck"}
		switch {
		case !hasHealthcheck(svc):
			problems = append(problems, fmt.Sprintf("service %s has no healthcheck: `docker compose up --wait` returns before %s is ready (test: %q)", name, entrypointBinary(svc), want))
		case !slices.Equal(svc.HealthCheck.Test, want):
			problems = append(problems, fmt.Sprintf("service %s: the health check %q does not ask %s (test: %q)", name, []string(svc.HealthCheck.Test), entrypointBinary(svc), want))
		}
	}
	return problems
}

// runsRepositoryImage tells whether the service runs the image of the
// repository's Dockerfile: it builds it, or it names the image that a
// service building it tags.
func runsRepositoryImage(p *types.Project, svc types.ServiceConfig) bool {
	dockerfile := filepath.Join(p.WorkingDir, "Dockerfile")
	if svc.Build != nil {
		return dockerfileOf(svc.Build) == dockerfile
	}
	for _, b := range p.Services {
		if b.Build != nil && dockerfileOf(b.Build) == dockerfile && b.Image != "" && b.Image == svc.Image {
			return true
		}
	}
	return false
}

// repeatedBuilds lists the Dockerfiles more than one service builds:
// docker compose builds a build section once per service, the same image
// again and again. One service builds it and tags it (build and image);
// the others name that image.
func repeatedBuilds(p *types.Project) []string {
	builders := map[string][]string{} // Dockerfile -> services
	for _, name := range serviceNames(p) {
		if b := p.Services[name].Build; b != nil {
			key := cmp.Or(dockerfileOf(b), b.Context+" (inline or remote)") + " target " + cmp.Or(b.Target, "(last)")
			builders[key] = append(builders[key], name)
		}
	}
	var problems []string
	for _, key := range slices.Sorted(maps.Keys(builders)) {
		if names := builders[key]; len(names) > 1 {
			problems = append(problems, fmt.Sprintf("services %s all build %s: it is built once per service; build it in one service with an image: name, and give the others that image", strings.Join(names, ", "), key))
		}
	}
	return problems
}

// adminOnly are the binaries whose only listener is ADMIN_ADDR (health,
// metrics, and the consumer's fault endpoint when it is on).
var adminOnly = []string{"outbox-relay", "order-consumer"}

// publishedAdminPorts lists the host ports of services that serve admin
// endpoints only: Prometheus scrapes them inside the compose network, and
// the consumer's fault endpoint must never be reachable from outside it.
func publishedAdminPorts(p *types.Project) []string {
	var problems []string
	for _, name := range serviceNames(p) {
		svc := p.Services[name]
		if !slices.Contains(adminOnly, entrypointBinary(svc)) {
			continue
		}
		for _, port := range svc.Ports {
			problems = append(problems, fmt.Sprintf("service %s (%s) publishes its admin port %d on the host (%s:%s): leave it inside the compose network", name, entrypointBinary(svc), port.Target, cmp.Or(port.HostIP, "0.0.0.0"), cmp.Or(port.Published, "ephemeral")))
		}
	}
	return problems
}

// grafanaAnonymousRole lists the Grafana services that give anonymous
// visitors more than Viewer: anyone reaching the port could change
// dashboards, data sources and users.
func grafanaAnonymousRole(p *types.Project) []string {
	var problems []string
	for _, name := range serviceNames(p) {
		svc := p.Services[name]
		repo, _, _ := imageParts(svc.Image)
		if !strings.HasPrefix(path.Base(repo), "grafana") {
			continue
		}
		if on, _ := strconv.ParseBool(envValue(svc, "GF_AUTH_ANONYMOUS_ENABLED")); !on {
			continue
		}
		// Grafana's default anonymous role is Viewer.
		if role := cmp.Or(envValue(svc, "GF_AUTH_ANONYMOUS_ORG_ROLE"), "Viewer"); !strings.EqualFold(role, "Viewer") {
			problems = append(problems, fmt.Sprintf("service %s: anonymous visitors are %s: give them Viewer at most (GF_AUTH_ANONYMOUS_ORG_ROLE), and change things with a login", name, role))
		}
	}
	return problems
}

// envValue is the value a service sets for a variable, "" when unset.
func envValue(svc types.ServiceConfig, name string) string {
	if v := svc.Environment[name]; v != nil {
		return *v
	}
	return ""
}

// brokerNodeNameProblems checks that every RabbitMQ service that keeps its
// data in a volume sets a hostname: the node is rabbit@<hostname> and
// keeps its data under that name, so a container with the default
// hostname (its id) boots as a new, empty node whenever compose recreates
// it, leaving the queues and their messages behind in the volume.
func brokerNodeNameProblems(p *types.Project) []string {
	var problems []string
	for _, svc := range rabbitmqNodes(p) {
		keeps := slices.ContainsFunc(svc.Volumes, func(v types.ServiceVolumeConfig) bool {
			return v.Type == types.VolumeTypeVolume && v.Target == "/var/lib/rabbitmq"
		})
		if keeps && svc.Hostname == "" {
			problems = append(problems, fmt.Sprintf("service %s keeps its data in a volume (/var/lib/rabbitmq) but sets no hostname: each new container is a new, empty node", svc.Name))
		}
	}
	return problems
}

// partitionReaders are the binaries that must agree on MESSAGE_PARTITIONS:
// the relays spread the messages over the partitions, each consumer
// declares a work queue per partition, and `orderctl status` reads those
// queues (with another count, it reports them absent).
var partitionReaders = []string{"outbox-relay", "order-consumer", "orderctl"}

// partitionProblems checks that every service of partitionReaders sets
// MESSAGE_PARTITIONS, all to the same value: a service that leaves it out
// runs with its binary's default, which a change of the others' leaves
// behind.
func partitionProblems(p *types.Project) []string {
	var problems []string
	byValue := map[string][]string{}
	for _, svc := range servicesWhere(p, func(svc types.ServiceConfig) bool {
		return slices.Contains(partitionReaders, entrypointBinary(svc))
	}) {
		if svc.Environment["MESSAGE_PARTITIONS"] == nil {
			problems = append(problems, fmt.Sprintf("service %s (%s) does not set MESSAGE_PARTITIONS", svc.Name, entrypointBinary(svc)))
			continue
		}
		v := envValue(svc, "MESSAGE_PARTITIONS")
		byValue[v] = append(byValue[v], svc.Name)
	}
	if len(byValue) > 1 {
		var sets []string
		for _, v := range slices.Sorted(maps.Keys(byValue)) {
			sets = append(sets, fmt.Sprintf("%q: %s", v, strings.Join(byValue[v], ", ")))
		}
		problems = append(problems, "MESSAGE_PARTITIONS differs between services: "+strings.Join(sets, "; "))
	}
	return problems
}

// faultsOn tells whether a service turns on the consumer's fault endpoint.
func faultsOn(svc types.ServiceConfig) bool {
	on, _ := strconv.ParseBool(envValue(svc, "CONSUMER_FAULTS_ENDPOINT"))
	return on
}

// faultEndpointsOn lists the services that turn the fault endpoint on: in
// the stack itself, none may (the demo override does).
func faultEndpointsOn(p *types.Project) []string {
	var problems []string
	for _, name := range serviceNames(p) {
		if faultsOn(p.Services[name]) {
			problems = append(problems, fmt.Sprintf("service %s turns the fault endpoint on (CONSUMER_FAULTS_ENDPOINT): only the demo override may", name))
		}
	}
	return problems
}

// demoProblems checks the demo: the walkthrough is there, is not started by
// `up` (a profile), and calls the fault endpoint of a consumer that serves
// it, by its service name, inside the compose network.
func demoProblems(p *types.Project) []string {
	walkthroughs := servicesWhere(p, func(svc types.ServiceConfig) bool { return entrypointBinary(svc) == "walkthrough" })
	if len(walkthroughs) == 0 {
		return []string{"no service runs the walkthrough"}
	}
	var problems []string
	for _, w := range walkthroughs {
		if len(w.Profiles) == 0 {
			problems = append(problems, fmt.Sprintf("service %s has no profile: `up` would start the walkthrough", w.Name))
		}
		raw := envValue(w, "CONSUMER_ADMIN_URL")
		u, err := url.Parse(raw)
		if err != nil || u.Hostname() == "" {
			problems = append(problems, fmt.Sprintf("service %s: CONSUMER_ADMIN_URL %q names no host", w.Name, raw))
			continue
		}
		consumer, ok := p.Services[u.Hostname()]
		switch {
		case !ok || entrypointBinary(consumer) != "order-consumer":
			problems = append(problems, fmt.Sprintf("service %s: CONSUMER_ADMIN_URL %s is not an order-consumer service of the compose network", w.Name, raw))
		case !faultsOn(consumer):
			problems = append(problems, fmt.Sprintf("service %s calls the fault endpoint of %s, which does not serve it (CONSUMER_FAULTS_ENDPOINT)", w.Name, consumer.Name))
		}
	}
	return problems
}

// portLookup is an interpolation lookup that gives every variable whose
// name ends in _PORT a value of its own (20001, 20002, ...) and leaves
// every other variable unset, so its default applies.
type portLookup struct {
	mu     sync.Mutex
	values map[string]string
}

func newPortLookup() *portLookup { return &portLookup{values: map[string]string{}} }

func (l *portLookup) lookup(name string) (string, bool) {
	if !strings.HasSuffix(name, "_PORT") {
		return "", false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.values[name]; !ok {
		l.values[name] = strconv.Itoa(20001 + len(l.values))
	}
	return l.values[name], true
}

// option makes the loader interpolate with the lookup.
func (l *portLookup) option() cli.ProjectOptionsFn {
	return cli.WithLoadOptions(func(o *loader.Options) {
		if o.Interpolate != nil { // nil when the loader only reads the files
			o.Interpolate.LookupValue = l.lookup
		}
	})
}

// fixedHostPorts compares the project loaded with no variable set
// (fixed) and loaded with every ..._PORT variable set (moved): a published
// host port that did not move is hard-coded, and collides with a server
// the developer already runs on it (a local PostgreSQL on 5432).
func fixedHostPorts(fixed, moved *types.Project) []string {
	var problems []string
	for _, name := range serviceNames(fixed) {
		ports := fixed.Services[name].Ports
		for i, port := range ports {
			if port.Published == "" {
				continue // ephemeral
			}
			other := moved.Services[name].Ports
			if i < len(other) && other[i].Published != port.Published {
				continue
			}
			problems = append(problems, fmt.Sprintf("service %s: host port %s is fixed: publish \"${ORDERS_..._PORT:-%s}:%d\" and document the variable", name, port.Published, port.Published, port.Target))
		}
	}
	return problems
}

// commandDirs are the folders that hold this repository's commands: the
// service's (cmd/) and its lab's (lab/, the tools around the service, which
// a team may delete).
var commandDirs = []string{"cmd", "lab"}

// repoCommands returns this repository's commands, each as its folder
// relative to the root ("cmd/order-api", "lab/walkthrough"): the folders
// under commandDirs that hold a main package. The binary of each is named
// after its folder (commandName). A missing lab/ is no error.
func repoCommands(t *testing.T) []string {
	t.Helper()
	var commands []string
	for _, top := range commandDirs {
		root := filepath.Join(testenv.RepoRoot(t), top)
		dirs, err := os.ReadDir(root)
		if top != "cmd" && errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range dirs {
			if !d.IsDir() {
				continue
			}
			files, err := filepath.Glob(filepath.Join(root, d.Name(), "*.go"))
			if err != nil {
				t.Fatal(err)
			}
			for _, file := range files {
				if strings.HasSuffix(file, "_test.go") {
					continue
				}
				f, err := parser.ParseFile(token.NewFileSet(), file, nil, parser.PackageClauseOnly)
				if err != nil {
					t.Fatal(err)
				}
				if f.Name.Name == "main" {
					commands = append(commands, top+"/"+d.Name())
					break
				}
			}
		}
	}
	if !slices.ContainsFunc(commands, func(c string) bool { return strings.HasPrefix(c, "cmd/") }) {
		t.Fatalf("no main package under cmd/ (found %v)", commands)
	}
	return commands
}

// commandName is the name of a command's binary: its folder's last part
// (go build -o dir/ names it so).
func commandName(folder string) string { return path.Base(folder) }

// commandNames maps commandName over folders.
func commandNames(folders []string) []string {
	names := make([]string, len(folders))
	for i, f := range folders {
		names[i] = commandName(f)
	}
	return names
}

// loadComposeDoc loads an inline compose document from a fresh directory
// holding files (path -> content), the way testenv.Compose loads the real
// one.
func loadComposeDoc(t *testing.T, doc string, files map[string]string, opts ...cli.ProjectOptionsFn) (*types.Project, error) {
	t.Helper()
	dir := t.TempDir()
	files = maps.Clone(files)
	if files == nil {
		files = map[string]string{}
	}
	files["compose.yml"] = doc
	for name, content := range files {
		file := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(file, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	opts = append([]cli.ProjectOptionsFn{cli.WithName("check"), cli.WithWorkingDirectory(dir)}, opts...)
	po, err := cli.NewProjectOptions([]string{filepath.Join(dir, "compose.yml")}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return po.LoadProject(t.Context())
}

// stackServices is a compose file with everything the walkthrough needs,
// each service under a name unlike the real file's: the checks must find
// services by image and entrypoint. Each value is a service's body.
var stackServices = map[string]string{
	"db": `
    image: postgres:16.4-alpine
    healthcheck: {test: [CMD, pg_isready, -h, 127.0.0.1]}`,
	"broker": `
    image: rabbitmq:3.13-management
    healthcheck: {test: [CMD, rabbitmq-diagnostics, ping]}`,
	"schema": `
    build: .
    image: orders:dev
    entrypoint: [/usr/local/bin/order-api]
    command: [migrate, up]
    restart: "no"
    depends_on: {db: {condition: service_healthy}}`,
	"api": `
    image: orders:dev
    entrypoint: [/usr/local/bin/order-api]
    healthcheck: {test: [CMD, /usr/local/bin/order-api, healthcheck]}
    restart: unless-stopped
    ports: ["8080:8080"]
    depends_on: {schema: {condition: service_completed_successfully}}`,
	"relay": `
    image: orders:dev
    entrypoint: [/usr/local/bin/outbox-relay]
    healthcheck: {test: [CMD, /usr/local/bin/outbox-relay, healthcheck]}
    deploy: {replicas: 2}
    depends_on:
      schema: {condition: service_completed_successfully}
      broker: {condition: service_healthy}`,
	"consumer": `
    image: orders:dev
    entrypoint: [/usr/local/bin/order-consumer]
    healthcheck: {test: [CMD, /usr/local/bin/order-consumer, healthcheck]}
    deploy: {replicas: 2}
    depends_on:
      schema: {condition: service_completed_successfully}
      broker: {condition: service_healthy}`,
	"hooks": `
    image: orders:dev
    entrypoint: [/usr/local/bin/webhook-receiver]
    healthcheck: {test: [CMD, /usr/local/bin/webhook-receiver, healthcheck]}`,
	"traces": `
    image: jaegertracing/all-in-one:1.62.0`,
	"scraper": `
    image: prom/prometheus:v2.55.1
    volumes: [./prometheus.yml:/etc/prometheus/prometheus.yml:ro]
    ports: ["9090:9090"]`,
	"dashboards": `
    image: grafana/grafana:11.3.1
    environment: {GF_AUTH_ANONYMOUS_ENABLED: "true", GF_AUTH_ANONYMOUS_ORG_ROLE: Viewer}
    ports: ["3000:3000"]`,
}

// stackFiles are the repository files stackServices refers to.
var stackFiles = map[string]string{"Dockerfile": "FROM scratch\n", "prometheus.yml": ""}

// stackDoc is stackServices with some services replaced, or removed when
// given "".
func stackDoc(changes map[string]string) string {
	services := maps.Clone(stackServices)
	for name, body := range changes {
		if body == "" {
			delete(services, name)
		} else {
			services[name] = body
		}
	}
	var b strings.Builder
	b.WriteString("services:\n")
	for _, name := range slices.Sorted(maps.Keys(services)) {
		fmt.Fprintf(&b, "  %s:%s\n", name, services[name])
	}
	return b.String()
}

// allProfiles loads the services of every profile, as testenv.Compose.
var allProfiles = []cli.ProjectOptionsFn{cli.WithProfiles([]string{"*"})}

// demoDoc is a demo stack: the consumer with its fault endpoint on, and
// the walkthrough calling it; changes as for stackDoc.
func demoDoc(changes map[string]string) string {
	all := map[string]string{
		"consumer": "\n    image: orders:dev\n    entrypoint: [/usr/local/bin/order-consumer]\n    environment: {CONSUMER_FAULTS_ENDPOINT: \"true\"}",
		"tour":     demoTour("http://consumer:9102", "[demo]"),
	}
	maps.Copy(all, changes)
	return stackDoc(all)
}

// demoTour is a walkthrough service calling the fault endpoint at
// adminURL, in profiles (none when "").
func demoTour(adminURL, profiles string) string {
	body := "\n    image: orders:dev\n    entrypoint: [/usr/local/bin/walkthrough]\n    environment: {CONSUMER_ADMIN_URL: \"" + adminURL + "\"}"
	if profiles != "" {
		body += "\n    profiles: " + profiles
	}
	return body
}

var testBinaries = []string{"order-api", "outbox-relay", "order-consumer", "webhook-receiver"}

// allComposeChecks runs every check, for the documents that must pass all.
func allComposeChecks(p *types.Project) []string {
	return slices.Concat(unversionedImages(p), dependencyProblems(p), postgresHealthcheckProblems(p), missingHostPaths(p),
		hostPortProblems(p), missingServices(p), builtServiceProblems(p, testBinaries), repeatedBuilds(p),
		publishedAdminPorts(p), grafanaAnonymousRole(p), faultEndpointsOn(p), serverHealthcheckProblems(p))
}

func TestComposeChecks(t *testing.T) {
	t.Parallel()
	builtServices := func(p *types.Project) []string { return builtServiceProblems(p, testBinaries) }
	tests := []struct {
		name  string
		check func(*types.Project) []string
		doc   string
		files map[string]string
		opts  []cli.ProjectOptionsFn
		want  []string // a part of each problem, in order; none: must pass
	}{
		{name: "complete stack", check: allComposeChecks, doc: stackDoc(nil), files: stackFiles},
		{name: "server without healthcheck", check: serverHealthcheckProblems, doc: stackDoc(map[string]string{"relay": "\n    image: orders:dev\n    entrypoint: [/usr/local/bin/outbox-relay]"}), files: stackFiles, want: []string{"service relay has no healthcheck"}},
		{name: "healthcheck of another binary", check: serverHealthcheckProblems, doc: stackDoc(map[string]string{"consumer": "\n    image: orders:dev\n    entrypoint: [/usr/local/bin/order-consumer]\n    healthcheck: {test: [CMD, /usr/local/bin/order-api, healthcheck]}"}), files: stackFiles, want: []string{"does not ask order-consumer"}},
		{name: "one-shot needs no healthcheck", check: serverHealthcheckProblems, doc: stackDoc(map[string]string{"tool": "\n    image: orders:dev\n    entrypoint: [/usr/local/bin/order-api]\n    restart: \"no\""}), files: stackFiles},

		// 0. the broker's node name, fixed where its data is kept
		{name: "broker without hostname", check: brokerNodeNameProblems, doc: "services:\n  mq:\n    image: rabbitmq:3.13.7\n    volumes: [mq-data:/var/lib/rabbitmq]\nvolumes:\n  mq-data:\n", want: []string{"service mq keeps its data in a volume (/var/lib/rabbitmq) but sets no hostname"}},
		{name: "broker with hostname", check: brokerNodeNameProblems, doc: "services:\n  mq:\n    image: rabbitmq:3.13.7\n    hostname: mq\n    volumes: [mq-data:/var/lib/rabbitmq]\nvolumes:\n  mq-data:\n"},
		{name: "broker without data", check: brokerNodeNameProblems, doc: "services:\n  mq:\n    image: rabbitmq:3.13.7\n"},

		// 0. the partitions, the same on every service that reads them
		{name: "partitions agree", check: partitionProblems, doc: "services:\n  relay:\n    image: a:1\n    entrypoint: [/usr/local/bin/outbox-relay]\n    environment: {MESSAGE_PARTITIONS: \"4\"}\n  ctl:\n    image: a:1\n    entrypoint: [/usr/local/bin/orderctl]\n    environment: {MESSAGE_PARTITIONS: \"4\"}\n  api:\n    image: a:1\n    entrypoint: [/usr/local/bin/order-api]\n"},
		{name: "orderctl without partitions", check: partitionProblems, doc: "services:\n  relay:\n    image: a:1\n    entrypoint: [/usr/local/bin/outbox-relay]\n    environment: {MESSAGE_PARTITIONS: \"4\"}\n  ctl:\n    image: a:1\n    entrypoint: [/usr/local/bin/orderctl]\n", want: []string{"service ctl (orderctl) does not set MESSAGE_PARTITIONS"}},
		{name: "partitions differ", check: partitionProblems, doc: "services:\n  relay:\n    image: a:1\n    entrypoint: [/usr/local/bin/outbox-relay]\n    environment: {MESSAGE_PARTITIONS: \"4\"}\n  consumer:\n    image: a:1\n    entrypoint: [/usr/local/bin/order-consumer]\n    environment: {MESSAGE_PARTITIONS: \"8\"}\n", want: []string{`MESSAGE_PARTITIONS differs between services: "4": relay; "8": consumer`}},

		// 1. images named by version
		{name: "image without tag", check: unversionedImages, doc: "services:\n  db:\n    image: postgres\n", want: []string{`"postgres" has no tag`}},
		{name: "image latest", check: unversionedImages, doc: "services:\n  db:\n    image: postgres:latest\n", want: []string{"latest moves"}},
		{name: "tag without version", check: unversionedImages, doc: "services:\n  mq:\n    image: rabbitmq:management\n", want: []string{`tag "management" names no version`}},
		{name: "distribution tag", check: unversionedImages, doc: "services:\n  db:\n    image: postgres:alpine3.20\n", want: []string{`tag "alpine3.20" names no version`}},
		{name: "registry port is not a tag", check: unversionedImages, doc: "services:\n  x:\n    image: localhost:5000/orders\n", want: []string{"has no tag"}},
		{name: "versioned tags and digest", check: unversionedImages, doc: "services:\n  a:\n    image: postgres:16.4-alpine\n  b:\n    image: prom/prometheus:v2.55.1\n  c:\n    image: rabbitmq@sha256:0000000000000000000000000000000000000000000000000000000000000000\n  d:\n    image: localhost:5000/orders:1.2\n"},
		{name: "built image needs no version", check: unversionedImages, doc: "services:\n  app:\n    image: yourorg/orders:local\n    build: .\n  other:\n    image: yourorg/orders:local\n"},
		{name: "image built elsewhere", check: unversionedImages, doc: "services:\n  app:\n    image: yourorg/orders:local\n    build: .\n  other:\n    image: yourorg/other:local\n", want: []string{`"yourorg/other:local": tag "local" names no version`}},

		// 2. depends_on
		{name: "healthy without healthcheck", check: dependencyProblems, doc: "services:\n  app:\n    image: a:1\n    depends_on: {db: {condition: service_healthy}}\n  db:\n    image: postgres:16\n", want: []string{"db has no healthcheck"}},
		{name: "healthcheck disabled", check: dependencyProblems, doc: "services:\n  app:\n    image: a:1\n    depends_on: {db: {condition: service_healthy}}\n  db:\n    image: postgres:16\n    healthcheck: {disable: true}\n", want: []string{"db has no healthcheck"}},
		{name: "healthcheck NONE", check: dependencyProblems, doc: "services:\n  app:\n    image: a:1\n    depends_on: {db: {condition: service_healthy}}\n  db:\n    image: postgres:16\n    healthcheck: {test: [NONE]}\n", want: []string{"db has no healthcheck"}},
		{name: "completed target restarts", check: dependencyProblems, doc: "services:\n  app:\n    image: a:1\n    depends_on: {migrate: {condition: service_completed_successfully}}\n  migrate:\n    image: a:1\n    restart: unless-stopped\n", want: []string{"migrate restarts (unless-stopped)"}},
		{name: "completed target restart policy", check: dependencyProblems, doc: "services:\n  app:\n    image: a:1\n    depends_on: {migrate: {condition: service_completed_successfully}}\n  migrate:\n    image: a:1\n    deploy: {restart_policy: {condition: on-failure}}\n", want: []string{"restarts (deploy.restart_policy on-failure)"}},
		{name: "missing target, loader consistency off", check: dependencyProblems, doc: "services:\n  app:\n    image: a:1\n    depends_on: [db]\n", opts: []cli.ProjectOptionsFn{cli.WithConsistency(false)}, want: []string{"db, which is not a service"}},
		{name: "dependencies that hold", check: dependencyProblems, doc: "services:\n  app:\n    image: a:1\n    depends_on:\n      db: {condition: service_healthy}\n      migrate: {condition: service_completed_successfully}\n      once: {condition: service_completed_successfully}\n  db:\n    image: postgres:16\n    healthcheck: {test: [CMD, pg_isready]}\n  migrate:\n    image: a:1\n    restart: \"no\"\n  once:\n    image: a:1\n"},

		// 2b. PostgreSQL's health check over TCP
		{name: "pg_isready on the socket", check: postgresHealthcheckProblems, doc: "services:\n  db:\n    image: postgres:16.4\n    healthcheck: {test: [CMD-SHELL, pg_isready -U postgres -d orders]}\n", want: []string{"connects over the Unix socket"}},
		{name: "socket directory as host", check: postgresHealthcheckProblems, doc: "services:\n  db:\n    image: postgres:16.4\n    healthcheck: {test: [CMD, pg_isready, -h, /var/run/postgresql]}\n", want: []string{"connects over the Unix socket"}},
		{name: "psql URL without host", check: postgresHealthcheckProblems, doc: "services:\n  db:\n    image: postgres:16.4\n    healthcheck: {test: [CMD, psql, \"postgresql:///orders\", -c, SELECT 1]}\n", want: []string{"connects over the Unix socket"}},
		{name: "health checks over TCP", check: postgresHealthcheckProblems, doc: "services:\n  a:\n    image: postgres:16.4\n    healthcheck: {test: [CMD-SHELL, pg_isready -h 127.0.0.1 -U postgres]}\n  b:\n    image: postgres:16.4\n    healthcheck: {test: [CMD, pg_isready, --host=localhost]}\n  c:\n    image: postgres:16.4\n    healthcheck: {test: [CMD, psql, \"host=127.0.0.1 user=postgres\", -c, SELECT 1]}\n  d:\n    image: postgres:16.4\n    healthcheck: {test: [CMD, psql, \"postgresql://postgres@127.0.0.1/orders\", -c, SELECT 1]}\n  e:\n    image: postgres:16.4\n    healthcheck: {test: [CMD-SHELL, pg_isready -h127.0.0.1]}\n"},

		// 3. host paths
		{name: "bind mount missing", check: missingHostPaths, doc: "services:\n  p:\n    image: p:1\n    volumes: [./prometheus.yml:/etc/prometheus/prometheus.yml]\n", want: []string{"prometheus.yml does not exist"}},
		{name: "bind mount long syntax missing", check: missingHostPaths, doc: "services:\n  p:\n    image: p:1\n    volumes: [{type: bind, source: ./dashboards, target: /d}]\n", want: []string{"dashboards does not exist"}},
		{name: "bind mount outside", check: missingHostPaths, doc: "services:\n  p:\n    image: p:1\n    volumes: [/etc:/host-etc:ro]\n", want: []string{"/etc is outside the repository"}},
		{name: "config file missing", check: missingHostPaths, doc: "services:\n  p:\n    image: p:1\n    configs: [prom]\nconfigs:\n  prom:\n    file: ./prometheus.yml\n", want: []string{"configs.prom: prometheus.yml does not exist"}},
		{name: "env_file missing", check: missingHostPaths, doc: "services:\n  p:\n    image: p:1\n    env_file: [app.env]\n", opts: []cli.ProjectOptionsFn{cli.WithoutEnvironmentResolution}, want: []string{"env_file: app.env does not exist"}},
		{name: "build context missing", check: missingHostPaths, doc: "services:\n  p:\n    build: ./service\n", want: []string{"build context: service does not exist", "build dockerfile: service/Dockerfile does not exist"}},
		{name: "paths present", check: missingHostPaths, doc: "services:\n  p:\n    build: .\n    volumes: [./conf:/conf, data:/data]\n    env_file: [app.env, {path: local.env, required: false}]\n    configs: [prom]\nconfigs:\n  prom:\n    file: ./conf/prometheus.yml\nvolumes:\n  data:\n", files: map[string]string{"Dockerfile": "FROM scratch\n", "conf/prometheus.yml": "", "app.env": "A=1\n"}},

		// 4. host ports
		{name: "port twice", check: hostPortProblems, doc: "services:\n  a:\n    image: a:1\n    ports: [\"8080:80\"]\n  b:\n    image: b:1\n    ports: [\"8080:8080\"]\n", want: []string{"8080/tcp is published by both service a and service b"}},
		{name: "port on all addresses and one", check: hostPortProblems, doc: "services:\n  a:\n    image: a:1\n    ports: [\"127.0.0.1:8080:80\"]\n  b:\n    image: b:1\n    ports: [\"8080:80\"]\n", want: []string{"8080/tcp is published by both"}},
		{name: "overlapping ranges", check: hostPortProblems, doc: "services:\n  a:\n    image: a:1\n    ports: [\"9000-9001:90-91\"]\n  b:\n    image: b:1\n    ports: [\"9001:80\"]\n", want: []string{"9001/tcp is published by both"}},
		{name: "replicas with fixed port", check: hostPortProblems, doc: "services:\n  a:\n    image: a:1\n    deploy: {replicas: 2}\n    ports: [\"9101:9101\"]\n", want: []string{"a has 2 replicas but publishes host port 9101"}},
		{name: "scale with short range", check: hostPortProblems, doc: "services:\n  a:\n    image: a:1\n    scale: 3\n    ports: [\"9100-9101:9101\"]\n", want: []string{"a has 3 replicas but publishes host port 9100-9101"}},
		{name: "ports that do not clash", check: hostPortProblems, doc: "services:\n  a:\n    image: a:1\n    ports: [\"127.0.0.1:8080:80\", \"53:53/udp\"]\n  b:\n    image: b:1\n    ports: [\"127.0.0.2:8080:80\", \"53:53/tcp\"]\n  c:\n    image: c:1\n    deploy: {replicas: 2}\n    ports: [\"9101\", \"9200-9201:9200\"]\n"},

		// 5. the whole stack
		// A service others depend on is swapped rather than removed, or the
		// loader would reject the document first.
		{name: "no postgres", check: missingServices, doc: stackDoc(map[string]string{"db": "\n    image: mysql:8.4\n    healthcheck: {test: [CMD, mysqladmin, ping]}"}), want: []string{"PostgreSQL (image postgres): 0 running"}},
		{name: "postgres without healthcheck", check: missingServices, doc: stackDoc(map[string]string{"db": "\n    image: postgres:16.4"}), want: []string{"service db (PostgreSQL) has no healthcheck"}},
		{name: "no rabbitmq", check: missingServices, doc: stackDoc(map[string]string{"broker": "\n    image: nats:2.10\n    healthcheck: {test: [CMD, nats-server, --help]}"}), want: []string{"RabbitMQ (image rabbitmq): 0 running"}},
		{name: "rabbitmq without management", check: missingServices, doc: stackDoc(map[string]string{"broker": "\n    image: rabbitmq:3.13-alpine\n    healthcheck: {test: [CMD, rabbitmq-diagnostics, ping]}"}), want: []string{"has no management UI"}},
		{name: "rabbitmq without healthcheck", check: missingServices, doc: stackDoc(map[string]string{"broker": "\n    image: rabbitmq:3.13-management"}), want: []string{"service broker (RabbitMQ) has no healthcheck"}},
		{name: "no migration step", check: missingServices, doc: stackDoc(map[string]string{"schema": "\n    build: .\n    entrypoint: [/usr/local/bin/order-api]\n    restart: \"no\""}), want: []string{"a migration step (a service running `<binary> migrate`): 0 running"}},
		{name: "migration restarts", check: missingServices, doc: stackDoc(map[string]string{"schema": "\n    build: .\n    entrypoint: [/usr/local/bin/outbox-relay]\n    command: [migrate, up]\n    restart: on-failure"}), want: []string{"service schema runs the migrations but restarts (on-failure)"}},
		{name: "no order-api", check: missingServices, doc: stackDoc(map[string]string{"api": ""}), want: []string{"order-api: 0 running"}},
		{name: "one relay", check: missingServices, doc: stackDoc(map[string]string{"relay": "\n    build: .\n    entrypoint: [/usr/local/bin/outbox-relay]"}), want: []string{"outbox-relay replicas: 1 running, want at least 2"}},
		{name: "two relay services", check: missingServices, doc: stackDoc(map[string]string{"relay": "\n    build: .\n    entrypoint: [/usr/local/bin/outbox-relay]", "relay2": "\n    build: .\n    entrypoint: [/usr/local/bin/outbox-relay]"})},
		{name: "no consumer", check: missingServices, doc: stackDoc(map[string]string{"consumer": ""}), want: []string{"order-consumer: 0 running"}},
		{name: "consumer scaled to zero", check: missingServices, doc: stackDoc(map[string]string{"consumer": "\n    build: .\n    entrypoint: [/usr/local/bin/order-consumer]\n    scale: 0"}), want: []string{"order-consumer: 0 running"}},
		{name: "no webhook receiver", check: missingServices, doc: stackDoc(map[string]string{"hooks": ""}), want: []string{"webhook-receiver: 0 running"}},
		{name: "no jaeger", check: missingServices, doc: stackDoc(map[string]string{"traces": ""}), want: []string{"Jaeger"}},
		{name: "no prometheus", check: missingServices, doc: stackDoc(map[string]string{"scraper": ""}), want: []string{"Prometheus"}},
		{name: "no grafana", check: missingServices, doc: stackDoc(map[string]string{"dashboards": ""}), want: []string{"Grafana"}},

		// 6. services built from the Dockerfile
		{name: "built service without entrypoint", check: builtServices, doc: "services:\n  app:\n    build: .\n", want: []string{"sets no entrypoint"}},
		{name: "entrypoint not in cmd", check: builtServices, doc: "services:\n  app:\n    build: .\n    entrypoint: [/usr/local/bin/orders-cli]\n", want: []string{`"/usr/local/bin/orders-cli" is not a command of cmd/ or lab/`}},
		{name: "api does not wait for migration", check: builtServices, doc: stackDoc(map[string]string{"api": "\n    build: .\n    entrypoint: [/usr/local/bin/order-api]"}), want: []string{"service api may start order-api before the schema exists"}},
		{name: "relay waits for migration to start only", check: builtServices, doc: stackDoc(map[string]string{"relay": "\n    build: .\n    entrypoint: [/usr/local/bin/outbox-relay]\n    depends_on: {schema: {condition: service_started}}"}), want: []string{"service relay may start outbox-relay before the schema exists"}},
		{name: "consumer waits for another one-shot", check: builtServices, doc: stackDoc(map[string]string{"consumer": "\n    build: .\n    entrypoint: [/usr/local/bin/order-consumer]\n    depends_on: {hooks: {condition: service_completed_successfully}}"}), want: []string{"service consumer may start order-consumer before the schema exists"}},
		{name: "api migrates on start", check: builtServices, doc: stackDoc(map[string]string{"api": "\n    build: .\n    entrypoint: [/usr/local/bin/order-api]\n    environment: {MIGRATE_ON_START: \"true\"}"})},
		{name: "api migrates with the flag", check: builtServices, doc: stackDoc(map[string]string{"api": "\n    build: .\n    entrypoint: [/usr/local/bin/order-api]\n    command: [-migrate]"})},
		{name: "another Dockerfile is not checked", check: builtServices, doc: "services:\n  tool:\n    build: {context: ., dockerfile: tools.Dockerfile}\n"},
		{name: "service naming the built image without entrypoint", check: builtServices, doc: "services:\n  app:\n    build: .\n    image: orders:dev\n    entrypoint: [/usr/local/bin/webhook-receiver]\n  other:\n    image: orders:dev\n", want: []string{"service other runs the image of the Dockerfile but sets no entrypoint"}},
		{name: "service naming the built image starts before the schema", check: builtServices, doc: stackDoc(map[string]string{"api": "\n    image: orders:dev\n    entrypoint: [/usr/local/bin/order-api]"}), want: []string{"service api may start order-api before the schema exists"}},

		// 7. one build
		{name: "every service builds", check: repeatedBuilds, doc: "services:\n  a:\n    build: .\n  b:\n    build: {context: .}\n  c:\n    build: .\n    image: orders:dev\n", want: []string{"services a, b, c all build"}},
		{name: "anchor merged into each service", check: repeatedBuilds, doc: "x-app: &app\n  image: orders:dev\n  build: .\nservices:\n  a:\n    <<: *app\n  b:\n    <<: *app\n", want: []string{"services a, b all build"}},
		{name: "one build, the others name its image", check: repeatedBuilds, doc: "services:\n  a:\n    build: .\n    image: orders:dev\n  b:\n    image: orders:dev\n  c:\n    build: {context: ., dockerfile: tools.Dockerfile}\n  d:\n    build: {context: ., target: debug}\n"},

		// 8. admin ports, the fault endpoint, Grafana
		{name: "consumer admin published", check: publishedAdminPorts, doc: "services:\n  c:\n    image: o:1\n    entrypoint: [/usr/local/bin/order-consumer]\n    ports: [\"9102:9102\"]\n", want: []string{"service c (order-consumer) publishes its admin port 9102 on the host (0.0.0.0:9102)"}},
		{name: "relay admin on an ephemeral port", check: publishedAdminPorts, doc: "services:\n  r:\n    image: o:1\n    entrypoint: [/usr/local/bin/outbox-relay]\n    ports: [\"127.0.0.1::9101\"]\n", want: []string{"service r (outbox-relay) publishes its admin port 9101 on the host (127.0.0.1:ephemeral)"}},
		{name: "api and webhook receiver published", check: publishedAdminPorts, doc: "services:\n  a:\n    image: o:1\n    entrypoint: [/usr/local/bin/order-api]\n    ports: [\"8080:8080\"]\n  w:\n    image: o:1\n    entrypoint: [/usr/local/bin/webhook-receiver]\n    ports: [\"8090:8090\"]\n  c:\n    image: o:1\n    entrypoint: [/usr/local/bin/order-consumer]\n    expose: [\"9102\"]\n"},
		{name: "fault endpoint on", check: faultEndpointsOn, doc: "services:\n  c:\n    image: o:1\n    environment: {CONSUMER_FAULTS_ENDPOINT: \"1\"}\n", want: []string{"service c turns the fault endpoint on"}},
		{name: "fault endpoint off", check: faultEndpointsOn, doc: "services:\n  c:\n    image: o:1\n    environment: {CONSUMER_FAULTS_ENDPOINT: \"false\"}\n  d:\n    image: o:1\n"},
		{name: "grafana anonymous admin", check: grafanaAnonymousRole, doc: "services:\n  g:\n    image: grafana/grafana:11.3.1\n    environment: {GF_AUTH_ANONYMOUS_ENABLED: \"true\", GF_AUTH_ANONYMOUS_ORG_ROLE: Admin}\n", want: []string{"anonymous visitors are Admin"}},
		{name: "grafana anonymous editor", check: grafanaAnonymousRole, doc: "services:\n  g:\n    image: grafana/grafana-oss:11.3.1\n    environment: [GF_AUTH_ANONYMOUS_ENABLED=1, GF_AUTH_ANONYMOUS_ORG_ROLE=Editor]\n", want: []string{"anonymous visitors are Editor"}},
		{name: "grafana viewers", check: grafanaAnonymousRole, doc: "services:\n  a:\n    image: grafana/grafana:11.3.1\n    environment: {GF_AUTH_ANONYMOUS_ENABLED: \"true\", GF_AUTH_ANONYMOUS_ORG_ROLE: viewer}\n  b:\n    image: grafana/grafana:11.3.1\n    environment: {GF_AUTH_ANONYMOUS_ENABLED: \"true\"}\n  c:\n    image: grafana/grafana:11.3.1\n    environment: {GF_AUTH_ANONYMOUS_ENABLED: \"false\", GF_AUTH_ANONYMOUS_ORG_ROLE: Admin}\n"},

		// 9. the demo
		{name: "demo without walkthrough", check: demoProblems, opts: allProfiles, doc: demoDoc(map[string]string{"tour": ""}), want: []string{"no service runs the walkthrough"}},
		{name: "walkthrough started by up", check: demoProblems, opts: allProfiles, doc: demoDoc(map[string]string{"tour": demoTour("http://consumer:9102", "")}), want: []string{"service tour has no profile"}},
		{name: "walkthrough calls the host", check: demoProblems, opts: allProfiles, doc: demoDoc(map[string]string{"tour": demoTour("http://127.0.0.1:9102", "[demo]")}), want: []string{"CONSUMER_ADMIN_URL http://127.0.0.1:9102 is not an order-consumer service"}},
		{name: "walkthrough calls the api", check: demoProblems, opts: allProfiles, doc: demoDoc(map[string]string{"tour": demoTour("http://api:9102", "[demo]")}), want: []string{"is not an order-consumer service"}},
		{name: "consumer without faults", check: demoProblems, opts: allProfiles, doc: demoDoc(map[string]string{"consumer": "\n    image: orders:dev\n    entrypoint: [/usr/local/bin/order-consumer]"}), want: []string{"service tour calls the fault endpoint of consumer, which does not serve it"}},
		{name: "demo", check: demoProblems, opts: allProfiles, doc: demoDoc(nil)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p, err := loadComposeDoc(t, tt.doc, tt.files, tt.opts...)
			if err != nil {
				t.Fatalf("load: %v\n%s", err, tt.doc)
			}
			wantProblems(t, tt.check(p), tt.want)
		})
	}
}

// TestComposeLoaderRejects holds what the loader, and so testenv.Compose,
// already refuses: the checks above need not look for it.
func TestComposeLoaderRejects(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, doc, want string
	}{
		{"undefined dependency", "services:\n  app:\n    image: a:1\n    depends_on: [db]\n", `depends on undefined service "db"`},
		{"undefined optional dependency", "services:\n  app:\n    image: a:1\n    depends_on: {db: {condition: service_started, required: false}}\n", `depends on undefined service "db"`},
		{"missing env_file", "services:\n  app:\n    image: a:1\n    env_file: [app.env]\n", "app.env not found"},
		{"scale and replicas differ", "services:\n  app:\n    image: a:1\n    scale: 2\n    deploy: {replicas: 3}\n", "distinct values"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := loadComposeDoc(t, tt.doc, nil)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("load error = %v, want one containing %q", err, tt.want)
			}
		})
	}
}

func TestFixedHostPorts(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, ports string
		want        []string
	}{
		{"fixed", `["8080:80"]`, []string{`service a: host port 8080 is fixed: publish "${ORDERS_..._PORT:-8080}:80"`}},
		{"fixed on one address", `["127.0.0.1:5432:5432"]`, []string{"host port 5432 is fixed"}},
		{"one of two fixed", `["${ORDERS_AMQP_PORT:-5672}:5672", "15672:15672"]`, []string{"host port 15672 is fixed"}},
		{"a variable that names no port", `["${ORDERS_HOST_IP:-127.0.0.1}:${API:-8080}:80"]`, []string{"host port 8080 is fixed"}},
		{"variables", `["${ORDERS_HOST_IP:-127.0.0.1}:${ORDERS_API_PORT:-8080}:80", "${B_PORT:-9000}:90", "7000"]`, nil},
		{"long syntax", `[{target: 80, published: "${ORDERS_API_PORT:-8080}"}]`, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			doc := "services:\n  a:\n    image: a:1\n    ports: " + tt.ports + "\n"
			fixed, err := loadComposeDoc(t, doc, nil)
			if err != nil {
				t.Fatal(err)
			}
			moved, err := loadComposeDoc(t, doc, nil, newPortLookup().option())
			if err != nil {
				t.Fatal(err)
			}
			wantProblems(t, fixedHostPorts(fixed, moved), tt.want)
		})
	}
}

// wantProblems fails t unless got holds exactly one problem per want, in
// order, each containing its want.
func wantProblems(t *testing.T, got, want []string) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("problems:\n%s\nwant %d containing %q", strings.Join(got, "\n"), len(want), want)
	}
	for i, w := range want {
		if !strings.Contains(got[i], w) {
			t.Errorf("problem %d = %q, want it to contain %q", i, got[i], w)
		}
	}
}

// localServerImages are the servers a developer often runs on this machine
// already, whose ports the stack's then collide with.
var localServerImages = []string{"postgres", "rabbitmq"}

// The README's quick start names the variable of every host port that a
// local PostgreSQL or RabbitMQ takes (5432, 5672, 15672): moving only the
// first one leads to the next "address already in use".
func TestREADMENamesThePortsOfLocalServers(t *testing.T) {
	t.Parallel()
	readme := readRepoFile(t, "README.md")
	lookup := newPortLookup()
	moved, err := testenv.LoadCompose(t, []cli.ProjectOptionsFn{lookup.option()}, testenv.ComposeFile)
	if err != nil {
		t.Fatal(err)
	}
	reportProblems(t, unnamedLocalPorts(moved, lookup.values, readme))
}

// unnamedLocalPorts lists the host ports of the local servers' images
// whose variable (values: each variable's value in moved) text does not
// name.
func unnamedLocalPorts(moved *types.Project, values map[string]string, text string) []string {
	var problems []string
	for _, name := range serviceNames(moved) {
		svc := moved.Services[name]
		repo, _, _ := imageParts(svc.Image)
		if !slices.Contains(localServerImages, path.Base(repo)) {
			continue
		}
		for _, port := range svc.Ports {
			variable := ""
			for v, value := range values {
				if value == port.Published {
					variable = v
				}
			}
			switch {
			case variable == "":
				problems = append(problems, fmt.Sprintf("service %s: port %d is published on a host port no variable moves", name, port.Target))
			case !strings.Contains(text, variable):
				problems = append(problems, fmt.Sprintf("README.md does not name %s, which moves service %s's port %d", variable, name, port.Target))
			}
		}
	}
	return problems
}

func TestUnnamedLocalPorts(t *testing.T) {
	t.Parallel()
	doc := `
services:
  db:
    image: postgres:15.8-alpine
    ports: ["127.0.0.1:${ORDERS_PG_PORT:-5432}:5432"]
  mq:
    image: rabbitmq:3.13.7-management-alpine
    ports: ["127.0.0.1:${ORDERS_AMQP_PORT:-5672}:5672", "127.0.0.1:15672:15672"]
  api:
    image: yourorg/orders:local
    ports: ["127.0.0.1:${ORDERS_API_PORT:-8080}:8080"]
`
	lookup := newPortLookup()
	p, err := loadComposeDoc(t, doc, nil, lookup.option())
	if err != nil {
		t.Fatal(err)
	}
	wantProblems(t, unnamedLocalPorts(p, lookup.values, "ORDERS_PG_PORT=15432 docker compose up"), []string{
		"README.md does not name ORDERS_AMQP_PORT, which moves service mq's port 5672",
		"service mq: port 15672 is published on a host port no variable moves",
	})
	wantProblems(t, unnamedLocalPorts(p, lookup.values, "ORDERS_PG_PORT ORDERS_AMQP_PORT"), []string{
		"service mq: port 15672 is published on a host port no variable moves",
	})
}
