package consumer_test

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/yourorg/orders/internal/consumer"
)

// The recipe of docs/extending.md holds: every consumer lives in a folder
// of its own under internal/consumer, named as the consumer, registered
// once in All; a consumer's package imports no other consumer's (its
// tables and queries are its own); and each folder has its tests. A folder
// added without its line in All, or a line without its folder, fails here.
func TestEveryConsumerFolderIsRegisteredOnce(t *testing.T) {
	t.Parallel()
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	var folders []string
	for _, e := range entries {
		// consumertest is the consumers' test kit, not a consumer.
		if e.IsDir() && e.Name() != "consumertest" {
			folders = append(folders, e.Name())
		}
	}
	names := consumer.Names()
	for _, f := range folders {
		if n := count(names, f); n != 1 {
			t.Errorf("internal/consumer/%s: registered %d times in consumer.All, want once (the folder is named as its consumer)", f, n)
		}
	}
	for _, n := range names {
		if !slices.Contains(folders, n) {
			t.Errorf("consumer %s has no folder internal/consumer/%s", n, n)
		}
	}
	fset := token.NewFileSet()
	for _, f := range folders {
		files, err := filepath.Glob(filepath.Join(f, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		hasTest := false
		for _, file := range files {
			if strings.HasSuffix(file, "_test.go") {
				hasTest = true
				continue
			}
			ast, err := parser.ParseFile(fset, file, nil, parser.ImportsOnly)
			if err != nil {
				t.Fatal(err)
			}
			for _, imp := range ast.Imports {
				path, _ := strconv.Unquote(imp.Path.Value)
				if rest, ok := strings.CutPrefix(path, "github.com/yourorg/orders/internal/consumer/"); ok && rest != f {
					t.Errorf("%s imports %s: a consumer keeps to its own folder", file, path)
				}
			}
		}
		if !hasTest {
			t.Errorf("internal/consumer/%s has no tests", f)
		}
	}
}

func count(names []string, name string) int {
	n := 0
	for _, x := range names {
		if x == name {
			n++
		}
	}
	return n
}
