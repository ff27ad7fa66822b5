package inbox_test

import (
	"testing"

	"github.com/yourorg/orders/internal/testenv"
)

// Every goroutine a relay or consumer starts ends when it stops.
func TestMain(m *testing.M) { testenv.VerifyNoLeaks(m) }
