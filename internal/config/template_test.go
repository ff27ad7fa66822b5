package config_test

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The module path is a placeholder that a team renames when it clones the
// repository. The rename of README.md's "Use it as a template" rewrites
// go.mod and tools/go.mod (go mod edit), and every .go file and
// .golangci.yml (grep | sed). This test fails when any other file names the
// module, which that rename would leave behind.

// rootDir is the repository, seen from this package.
const rootDir = "../.."

// mayNameModule reports whether a file (a slash path relative to the root)
// may name the module: the rename rewrites it, or, for README.md, the file
// describes the rename, placeholder and all.
func mayNameModule(rel string) bool {
	switch rel {
	case "go.mod", "tools/go.mod", "README.md":
		return true
	}
	return strings.HasSuffix(rel, ".go") || filepath.Base(rel) == ".golangci.yml"
}

// The directories and file names not searched: version control, build
// output, and local files that .gitignore keeps out of the repository.
var (
	notSearchedDirs  = []string{".git", "bin", "vendor", "node_modules"}
	notSearchedFiles = []string{"*.test", "*.out", "*.prof", "coverage.*", ".env"}
)

func modulePath(t *testing.T) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(rootDir, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(raw)) {
		if path, ok := strings.CutPrefix(strings.TrimSpace(line), "module "); ok {
			return strings.Trim(strings.TrimSpace(path), `"`)
		}
	}
	t.Fatal("go.mod has no module line")
	return ""
}

func TestModulePathOnlyWhereTheRenameReachesIt(t *testing.T) {
	t.Parallel()
	module := []byte(modulePath(t))
	var found []string
	err := filepath.WalkDir(rootDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != rootDir && slices.Contains(notSearchedDirs, d.Name()) {
				return filepath.SkipDir
			}
			return nil
		}
		for _, pattern := range notSearchedFiles {
			if ok, _ := filepath.Match(pattern, d.Name()); ok {
				return nil
			}
		}
		if !d.Type().IsRegular() {
			return nil
		}
		raw, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(rootDir, path)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if bytes.Contains(raw, module) {
			found = append(found, rel)
			if !mayNameModule(rel) {
				t.Errorf("%s names the module %s, and the rename of README.md (Use it as a template) does not rewrite it: "+
					"do not name the module there, or add the file to that rename and to mayNameModule", rel, module)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The search saw the files it must: a walk that found nothing would pass.
	for _, want := range []string{"go.mod", "cmd/order-api/main.go"} {
		if !slices.Contains(found, want) {
			t.Errorf("the module path was not found in %s (found in %v)", want, found)
		}
	}
}

// README.md's rename reaches the files mayNameModule lists.
func TestREADMERenamesTheModuleEverywhere(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile(filepath.Join(rootDir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(raw), "\n## Use it as a template\n")
	if !ok {
		t.Fatal(`README.md has no section "## Use it as a template"`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	for _, want := range []string{
		"go mod edit -module ",    // go.mod
		"tools/go.mod",            // its own module, github.com/yourorg/orders/tools
		"--include='*.go'",        // imports, meter and tracer names
		"--include=.golangci.yml", // depguard, errcheck and goimports settings
		"xargs sed -i 's#",        // the replacement itself
	} {
		if !strings.Contains(section, want) {
			t.Errorf("README.md, Use it as a template: the rename lacks %q", want)
		}
	}
}
