package e2e

import (
	"os"
	"testing"

	"github.com/yourorg/orders/internal/testenv"
)

// TestMain stops the test binary's PostgreSQL with wal_level=logical after
// the tests, if one of them started it (newWALSystem).
func TestMain(m *testing.M) {
	code := m.Run()
	testenv.StopLogicalPostgres()
	os.Exit(code)
}
