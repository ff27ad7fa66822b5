//go:build !linux

package testenv

import "os/exec"

// startTiedToTest starts cmd. Only Linux kills a child with its parent: a
// test binary that dies without its cleanups here leaves the nodes of its
// cluster running (kill them by their names, rabbit-<id>-<n>@localhost).
func startTiedToTest(cmd *exec.Cmd) error { return cmd.Start() }
