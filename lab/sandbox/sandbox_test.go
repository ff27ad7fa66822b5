package sandbox

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// BuildRevision builds a command as it was at a git revision, and leaves
// no sources behind.
func TestBuildRevision(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds a command")
	}
	if err := exec.Command("git", "rev-parse", "--verify", "HEAD").Run(); err != nil {
		t.Skipf("not in a git checkout with a commit: %v", err)
	}
	out, tmp := t.TempDir(), t.TempDir()
	if err := BuildRevision(t.Context(), "HEAD", out, tmp, "lab/webhook-receiver"); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(out, "webhook-receiver")); err != nil || fi.Mode()&0o111 == 0 {
		t.Fatalf("no executable webhook-receiver in %s: %v", out, err)
	}
	if left, _ := os.ReadDir(tmp); len(left) != 0 {
		t.Errorf("the sources are still in %s: %v", tmp, left)
	}
	if err := BuildRevision(t.Context(), "no-such-revision", out, tmp, "lab/webhook-receiver"); err == nil {
		t.Error("an unknown revision built")
	}
}
