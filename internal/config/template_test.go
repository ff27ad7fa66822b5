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
// repository. The rename of docs/template.md ("Rename the module") rewrites
// go.mod and tools/go.mod (go mod edit), and every .go file and
// .golangci.yml (grep | sed). This test fails when any other file names the
// module, which that rename would leave behind.

// rootDir is the repository, seen from this package.
const rootDir = "../.."

// templatePage describes the rename (relative to rootDir), and renameSection
// is the heading of its section that does.
const (
	templatePage  = "docs/template.md"
	renameSection = "## Rename the module"
)

// mayNameModule reports whether a file (a slash path relative to the root)
// may name the module: the rename rewrites it, or, for the template page,
// the file describes the rename, placeholder and all.
func mayNameModule(rel string) bool {
	switch rel {
	case "go.mod", "tools/go.mod", templatePage:
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
				t.Errorf("%s names the module %s, and the rename of %s (%s) does not rewrite it: "+
					"do not name the module there, or add the file to that rename and to mayNameModule", rel, module, templatePage, renameSection)
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

// The template page's rename reaches the files mayNameModule lists.
func TestTemplatePageRenamesTheModuleEverywhere(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile(filepath.Join(rootDir, templatePage))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(raw), "\n"+renameSection+"\n")
	if !ok {
		t.Fatalf("%s has no section %q", templatePage, renameSection)
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
			t.Errorf("%s, %s: the rename lacks %q", templatePage, renameSection, want)
		}
	}
}
