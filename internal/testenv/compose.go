package testenv

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
)

// Compose loads the repository's docker-compose.yml with the compose-spec
// loader, the way docker compose reads it (interpolation, anchors, merge
// keys, validation), with no Docker engine.
func Compose(t testing.TB) *types.Project {
	t.Helper()
	path := filepath.Join(RepoRoot(t), "docker-compose.yml")
	opts, err := cli.NewProjectOptions([]string{path}, cli.WithName("orders"), cli.WithWorkingDirectory(RepoRoot(t)),
		// Every service, those of optional profiles ("tools") too.
		cli.WithProfiles([]string{"*"}))
	if err != nil {
		t.Fatal(err)
	}
	project, err := opts.LoadProject(t.Context())
	if err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	return project
}

// ComposeServicesOf returns the compose services whose entrypoint runs the
// given binary of this repository (order-api, outbox-relay, ...).
func ComposeServicesOf(p *types.Project, binary string) []types.ServiceConfig {
	var out []types.ServiceConfig
	for _, svc := range p.Services {
		if len(svc.Entrypoint) > 0 && filepath.Base(svc.Entrypoint[0]) == binary {
			out = append(out, svc)
		}
	}
	return out
}

// ComposeSetsOnly fails t unless some service of docker-compose.yml runs
// binary, and every such service sets only environment variables in known
// (those the binary reads): any other is a setting that silently does
// nothing, a misspelling most of the time.
func ComposeSetsOnly(t *testing.T, binary string, known []string) {
	t.Helper()
	services := ComposeServicesOf(Compose(t), binary)
	if len(services) == 0 {
		t.Fatalf("no service of docker-compose.yml runs %s", binary)
	}
	for _, svc := range services {
		for name := range svc.Environment {
			if !slices.Contains(known, name) {
				t.Errorf("docker-compose.yml: service %s sets %s, which %s does not read", svc.Name, name, binary)
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
