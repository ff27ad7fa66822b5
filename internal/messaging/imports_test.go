package messaging_test

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// The outbox and the inbox stand on their own: a team keeps them and
// replaces the order service around them. So the mechanisms may import,
// of this module, only each other and the few packages below them that
// know nothing of orders. This test fails when any other import comes
// back, naming the package and who imports it.
func TestMechanismsImportNothingOfTheOrderService(t *testing.T) {
	const module = "github.com/yourorg/orders/"
	allowed := []string{
		module + "internal/messaging",
		module + "internal/database",   // the PostgreSQL edge
		module + "internal/background", // reconnect and retention loops
		module + "internal/logctx",     // log attributes in a context
	}
	ok := func(pkg string) bool {
		for _, a := range allowed {
			if pkg == a || strings.HasPrefix(pkg, a+"/") {
				return true
			}
		}
		return false
	}
	// The mechanisms' test-support packages (outboxtest, inboxtest: the
	// relay suite both row sources run, rows in given states) may use the
	// servers and faults of internal/testenv, the test infrastructure a
	// team keeps with them; nothing else of the service.
	testSupport := func(pkg, imp string) bool {
		return strings.HasSuffix(pkg, "test") && imp == module+"internal/testenv"
	}
	out, err := exec.Command("go", "list", "-deps", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`,
		module+"internal/messaging/...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	var problems []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		pkg, imports := fields[0], fields[1:]
		if !ok(pkg) {
			continue // not a mechanism package; the ones importing it are reported
		}
		for _, imp := range imports {
			if strings.HasPrefix(imp, module) && !ok(imp) && !testSupport(pkg, imp) {
				problems = append(problems, pkg+" imports "+imp)
			}
		}
	}
	slices.Sort(problems)
	if len(problems) > 0 {
		t.Fatalf("the mechanisms import the order service (allowed of this module: %v):\n%s",
			allowed, strings.Join(problems, "\n"))
	}
}

// The mechanisms' own tests run without the order service too: on a
// database with the mechanism's schema alone (testenv.NewDatabase(t,
// outbox.Schema)), never the service's migrations or its store.
func TestMechanismsTestsNeedNothingOfTheOrderService(t *testing.T) {
	const module = "github.com/yourorg/orders/"
	service := []string{module + "migrations", module + "internal/store", module + "internal/domain", module + "internal/app"}
	out, err := exec.Command("go", "list", "-deps", "-test", module+"internal/messaging/outbox/...", module+"internal/messaging/inbox/...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, pkg := range strings.Fields(string(out)) {
		if slices.Contains(service, pkg) {
			t.Errorf("a mechanism's test binary links %s", pkg)
		}
	}
}
