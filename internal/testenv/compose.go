package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
)

// The repository's compose files: the stack, the demo override that adds
// the walkthrough and turns on the consumer's fault endpoint, the cluster
// override that runs three RabbitMQ nodes in place of one, and the HA
// override that runs PostgreSQL as a primary and a standby under Patroni.
const (
	ComposeFile        = "docker-compose.yml"
	DemoComposeFile    = "docker-compose.demo.yml"
	ClusterComposeFile = "docker-compose.cluster.yml"
	HAComposeFile      = "docker-compose.ha.yml"
)

// Compose loads compose files of the repository (by default ComposeFile
// alone; later files override earlier ones, as with docker compose -f ...
// -f ...) with the compose-spec loader, the way docker compose reads them
// (interpolation with no variable set, anchors, merge keys, validation),
// with no Docker engine. Services of every profile are included.
func Compose(t testing.TB, files ...string) *types.Project {
	t.Helper()
	project, err := LoadCompose(t, nil, files...)
	if err != nil {
		t.Fatal(err)
	}
	return project
}

// LoadCompose is Compose with options of the loader added (an
// interpolation lookup, say), returning the loader's error.
func LoadCompose(t testing.TB, opts []cli.ProjectOptionsFn, files ...string) (*types.Project, error) {
	t.Helper()
	if len(files) == 0 {
		files = []string{ComposeFile}
	}
	root := RepoRoot(t)
	paths := make([]string, len(files))
	for i, f := range files {
		paths[i] = filepath.Join(root, f)
	}
	opts = append([]cli.ProjectOptionsFn{cli.WithName("orders"), cli.WithWorkingDirectory(root),
		// Every service, those of optional profiles ("demo") too.
		cli.WithProfiles([]string{"*"})}, opts...)
	po, err := cli.NewProjectOptions(paths, opts...)
	if err != nil {
		return nil, err
	}
	project, err := po.LoadProject(t.Context())
	if err != nil {
		return nil, fmt.Errorf("%s: %w", strings.Join(files, " + "), err)
	}
	return project, nil
}

// ComposeServicesOf returns the compose services whose entrypoint runs the
// given binary of this repository: a command of cmd/ (order-api,
// outbox-relay, ...) or of lab/ (walkthrough, webhook-receiver).
func ComposeServicesOf(p *types.Project, binary string) []types.ServiceConfig {
	var out []types.ServiceConfig
	for _, svc := range p.Services {
		if len(svc.Entrypoint) > 0 && filepath.Base(svc.Entrypoint[0]) == binary {
			out = append(out, svc)
		}
	}
	return out
}

// ComposeSetsOnly fails t unless some service of the compose files (the
// stack with the demo override) runs binary, and every such service sets
// only environment variables in known (those the binary reads): any other
// is a setting that silently does nothing, a misspelling most of the time.
func ComposeSetsOnly(t *testing.T, binary string, known []string) {
	t.Helper()
	services := ComposeServicesOf(Compose(t, ComposeFile, DemoComposeFile), binary)
	if len(services) == 0 {
		t.Fatalf("no service of %s or %s runs %s", ComposeFile, DemoComposeFile, binary)
	}
	for _, svc := range services {
		for name := range svc.Environment {
			if !slices.Contains(known, name) {
				t.Errorf("%s + %s: service %s sets %s, which %s does not read", ComposeFile, DemoComposeFile, svc.Name, name, binary)
			}
		}
	}
}

// RepoRoot is the repository's root: the nearest directory above the
// working directory that holds both go.mod and docker-compose.yml (tools/
// has a go.mod of its own).
func RepoRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if exists(filepath.Join(dir, "go.mod")) && exists(filepath.Join(dir, "docker-compose.yml")) {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("testenv: go.mod of the repository not found")
		}
		dir = parent
	}
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
