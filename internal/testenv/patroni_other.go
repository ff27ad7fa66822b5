//go:build !linux

package testenv

import (
	"errors"
	"os"
	"os/exec"
)

// processesSupported says whether this system lets the Patroni fixture
// find and kill its processes: it reads Linux's /proc.
func processesSupported() error {
	return errors.New("the fixture finds and kills PostgreSQL's processes through Linux's /proc: it runs on Linux only")
}

func ownProcessGroup(*exec.Cmd) {}

func killGroup(pid int) error {
	p, err := os.FindProcess(pid)
	if err != nil {
		return nil
	}
	return p.Kill()
}

func mentioning(string) []int { return nil }
