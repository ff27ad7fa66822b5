package testenv

import (
	"bytes"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/uuid"
)

// WaitFor polls cond every 20ms until it holds, and fails t naming what it
// waited for when timeout passes first.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// WaitOK waits until a GET of url answers 200 (a process's /readyz).
func WaitOK(t testing.TB, timeout time.Duration, url string) {
	t.Helper()
	WaitFor(t, timeout, url+" to answer 200", func() bool {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

// READMEDocuments fails t for each variable the README's configuration
// table does not name (as `VARIABLE`).
func READMEDocuments(t testing.TB, variables []string) {
	t.Helper()
	readme, err := os.ReadFile(filepath.Join(RepoRoot(t), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range variables {
		if !bytes.Contains(readme, []byte("`"+v+"`")) {
			t.Errorf("README.md does not document %s", v)
		}
	}
}

// NewID is a fresh UUIDv7, for ids a test makes up.
func NewID() uuid.UUID { return uuid.Must(uuid.NewV7()) }
