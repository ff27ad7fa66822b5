package testenv

import "testing"

// needsServers skips t under `go test -short` (make test/unit): t needs
// the real server named by what, and -short runs only the tests that need
// none. Every function of this package that reaches a server calls it
// first, so a test needs no -short check of its own.
func needsServers(t testing.TB, what string) {
	t.Helper()
	if testing.Short() {
		t.Skipf("testenv: this test needs %s; skipped under -short (make test/unit)", what)
	}
}
