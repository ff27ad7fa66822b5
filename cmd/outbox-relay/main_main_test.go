package main

import (
	"testing"

	"github.com/yourorg/orders/internal/testenv"
)

// Every goroutine the process starts ends when it stops; the PostgreSQL
// with wal_level=logical the wal test starts is stopped at the end.
func TestMain(m *testing.M) { testenv.VerifyNoLeaks(m) }
