// Package template checks the promise of lab/README.md: lab/ holds the
// tools around the service, and a team that takes the repository as its
// template may delete that folder and keep a service that builds. Nothing
// outside lab/ may import a package of it.
package template

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/yourorg/orders/internal/testenv"
)

// labDir is the folder of the tools around the service.
const labDir = "lab"

// The repository without lab/ builds and vets: go build ./... compiles
// every package, and go vet ./... the tests as well, so an import of a lab
// package from anywhere else, a test included, fails here with the
// compiler's words.
func TestServiceBuildsWithoutTheLab(t *testing.T) {
	t.Parallel()
	root := testenv.RepoRoot(t)
	if _, err := os.Stat(filepath.Join(root, labDir)); errors.Is(err, fs.ErrNotExist) {
		t.Skipf("no %s/ in this checkout: the build of the repository itself proves it", labDir)
	}
	dir := t.TempDir()
	copied := copyWithout(t, root, dir, labDir)
	if copied == 0 {
		t.Fatal("git listed no file outside lab/")
	}
	for _, args := range [][]string{{"build", "./..."}, {"vet", "./..."}} {
		cmd := exec.CommandContext(t.Context(), "go", args...)
		cmd.Dir = dir
		// The copy's own go.mod, whatever workspace the caller has.
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("without %s/, go %s fails (%v): a file outside %s/ needs it\n%s",
				labDir, strings.Join(args, " "), err, labDir, out)
		}
	}
}

// copyWithout copies the files git knows of in root (tracked, and new ones
// not ignored, so that work not yet committed is checked too) into dir,
// except those under skip, and returns how many it copied.
func copyWithout(t *testing.T, root, dir, skip string) int {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), "git", "ls-files", "-z", "--cached", "--others", "--exclude-standard")
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("git ls-files: %v\n%s", err, stderr.String())
	}
	n := 0
	for name := range strings.SplitSeq(strings.TrimSuffix(string(out), "\x00"), "\x00") {
		if name == "" || name == skip || strings.HasPrefix(name, skip+"/") {
			continue
		}
		src := filepath.Join(root, filepath.FromSlash(name))
		info, err := os.Lstat(src)
		if errors.Is(err, fs.ErrNotExist) {
			continue // deleted in the working tree, not yet in git
		} else if err != nil {
			t.Fatal(err)
		}
		if !info.Mode().IsRegular() {
			continue
		}
		raw, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, raw, info.Mode().Perm()); err != nil {
			t.Fatal(err)
		}
		n++
	}
	return n
}
