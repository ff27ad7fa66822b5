package e2e

import (
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/yourorg/orders/internal/testenv"
)

// Each binary's healthcheck sub-command, docker compose's health check,
// exits 0 only while the process it asks can do its work: not before it
// listens, not while the relay cannot publish (the consumers' queues do
// not exist yet), not after the process stopped.
func TestHealthcheckCommand(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	relay, consumer := []string{"ADMIN_ADDR=" + testenv.FreeAddr(t), "RELAY_ID=relay"}, []string{"ADMIN_ADDR=" + testenv.FreeAddr(t)}

	s.wantHealthcheck("order-consumer", consumer, false, "")
	s.launch("relay", "outbox-relay", nil, relay...)
	testenv.WaitFor(t, 30*time.Second, "the relay's healthcheck to fail naming the missing queues", func() bool {
		out, ok := s.healthcheck("outbox-relay", relay)
		return !ok && strings.Contains(out, "orders.warehouse")
	})
	s.start("consumer", "order-consumer", "http://"+strings.TrimPrefix(consumer[0], "ADMIN_ADDR=")+"/readyz", nil, consumer...)
	s.wantHealthcheck("order-consumer", consumer, true, `"ready"`)
	// The consumer declared every queue: the relay can publish.
	testenv.WaitFor(t, 30*time.Second, "the relay's healthcheck to succeed", func() bool {
		_, ok := s.healthcheck("outbox-relay", relay)
		return ok
	})
	s.startAPI()
	s.wantHealthcheck("order-api", []string{"HTTP_ADDR=" + strings.TrimPrefix(s.apiURL, "http://")}, true, `"ready"`)

	s.stop("consumer")
	s.wantHealthcheck("order-consumer", consumer, false, "")
}

// healthcheck runs `binary healthcheck` with a process's environment and
// returns its output and whether it exited 0 (an exit code other than 0
// or 1 fails the test: docker reads 1 as unhealthy, 2 and up are reserved).
func (s *system) healthcheck(binary string, env []string) (string, bool) {
	s.t.Helper()
	cmd := exec.Command(filepath.Join(s.bin, binary), "healthcheck")
	cmd.Env = s.processEnv(binary, env...)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return string(out), true
	case errors.As(err, &exit) && exit.ExitCode() == 1:
		return string(out), false
	default:
		s.t.Fatalf("%s healthcheck: %v\n%s", binary, err, out)
		return "", false
	}
}

// wantHealthcheck checks that `binary healthcheck` succeeds or fails now,
// and prints want.
func (s *system) wantHealthcheck(binary string, env []string, healthy bool, want string) {
	s.t.Helper()
	out, ok := s.healthcheck(binary, env)
	if ok != healthy || !strings.Contains(out, want) {
		s.t.Errorf("%s healthcheck: exit 0 = %t, want %t; output %q, want it to contain %q", binary, ok, healthy, out, want)
	}
}
