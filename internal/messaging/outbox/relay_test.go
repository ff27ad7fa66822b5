package outbox_test

import (
	"testing"

	"github.com/yourorg/orders/internal/messaging/outbox/outboxtest"
)

// The relay's contract (package outboxtest), against the polling relay.
// Package wal runs it against the log-tailing relay.
func TestRelay(t *testing.T) { outboxtest.Run(t, outboxtest.Poll) }

func setupRelay(t testing.TB) *outboxtest.Bundle {
	t.Helper()
	return outboxtest.Setup(t, outboxtest.Poll)
}
