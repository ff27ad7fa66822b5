package testenv

import (
	"bytes"
	"net/http"
	"os"
	"path/filepath"
	"slices"
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

// ConfigurationPage is the page that documents every setting, relative to
// the repository's root.
const ConfigurationPage = "docs/configuration.md"

// ConfigurationDocuments fails t for each variable that no table row of
// the configuration page names (as `VARIABLE` in its first cell).
func ConfigurationDocuments(t testing.TB, variables []string) {
	t.Helper()
	page, err := os.ReadFile(filepath.Join(RepoRoot(t), ConfigurationPage))
	if err != nil {
		t.Fatal(err)
	}
	var named [][]byte // the first cell of every table row
	for line := range bytes.Lines(page) {
		cells := bytes.Split(bytes.TrimSpace(line), []byte("|"))
		if len(cells) > 2 && len(cells[0]) == 0 {
			named = append(named, cells[1])
		}
	}
	for _, v := range variables {
		if !slices.ContainsFunc(named, func(cell []byte) bool { return bytes.Contains(cell, []byte("`"+v+"`")) }) {
			t.Errorf("%s does not document %s: no table row names it", ConfigurationPage, v)
		}
	}
}

// NewID is a fresh UUIDv7, for ids a test makes up.
func NewID() uuid.UUID { return uuid.Must(uuid.NewV7()) }
