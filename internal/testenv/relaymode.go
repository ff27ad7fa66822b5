package testenv

import (
	"cmp"
	"os"
	"testing"
)

// RelayModeVar names the variable that says which relay mode a test run
// is for: poll (unset) or wal (make test/wal). The tests of the
// log-tailing relay need PostgreSQL with wal_level=logical
// (LogicalPostgres), which the test binary starts: they run in a wal run
// only, so that `go test ./...` runs each relay test once, with the
// polling relay.
const RelayModeVar = "OUTBOX_TEST_RELAY_MODE"

// SkipUnlessWAL skips t unless the run is for the log-tailing relay
// (OUTBOX_TEST_RELAY_MODE=wal).
func SkipUnlessWAL(t testing.TB) {
	t.Helper()
	if mode := cmp.Or(os.Getenv(RelayModeVar), "poll"); mode != "wal" {
		t.Skipf("the log-tailing relay's: run with %s=wal (make test/wal); this run: %s", RelayModeVar, mode)
	}
}
