//go:build !linux

package testenv

import (
	"errors"
	"os/exec"
)

// startTiedToTest starts cmd. Only Linux kills a child with its parent: a
// test binary that dies without its cleanups here leaves the nodes of its
// cluster running (kill them by their names, rabbit-<id>-<n>@localhost),
// and its PostgreSQL with wal_level=logical (it stops by itself within a
// minute of the next test binary that needs one removing its directory).
func startTiedToTest(cmd *exec.Cmd) error { return cmd.Start() }

// runAs would make cmd run as another user. Only the Linux build does:
// elsewhere a test binary runs as the user who runs PostgreSQL, and one
// running as root has to be run as another user instead.
func runAs(*exec.Cmd, uint32, uint32) error {
	return errors.New("running PostgreSQL as another user than root's is done on Linux only: run the tests as an ordinary user")
}
