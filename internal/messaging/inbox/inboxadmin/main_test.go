package inboxadmin_test

import (
	"testing"

	"github.com/yourorg/orders/internal/testenv"
)

// Every goroutine a parking-lot tool starts ends when it returns.
func TestMain(m *testing.M) { testenv.VerifyNoLeaks(m) }
