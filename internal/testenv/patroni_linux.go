package testenv

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// processesSupported says whether this system lets the Patroni fixture
// find and kill its processes: Linux does, through /proc.
func processesSupported() error { return nil }

// ownProcessGroup makes cmd the leader of a process group of its own, so
// that killGroup takes the processes it starts with it.
func ownProcessGroup(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
}

// killGroup kills process pid with SIGKILL, with its process group when it
// leads one (a postmaster and its backends, a Patroni and its helpers),
// and waits up to ten seconds until they are gone. A process of the test
// binary's own group is killed alone.
func killGroup(pid int) error {
	pgid, err := syscall.Getpgid(pid)
	if err != nil {
		return nil // gone already
	}
	target := pid
	if pgid == pid && pgid != syscall.Getpgrp() {
		target = -pgid
	}
	if err := syscall.Kill(target, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("kill %d: %w", target, err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		left := groupMembers(pgid)
		if target == pid {
			left = nil
			if alive(pid) {
				left = []int{pid}
			}
		}
		if len(left) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("processes %v still alive 10s after SIGKILL", left)
		}
	}
}

// groupMembers lists the live processes (zombies aside) of process group
// pgid.
func groupMembers(pgid int) []int {
	var pids []int
	for _, pid := range allPIDs() {
		if g, err := syscall.Getpgid(pid); err == nil && g == pgid && alive(pid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// mentioning lists the live processes, this one aside, whose command line
// contains s.
func mentioning(s string) []int {
	var pids []int
	for _, pid := range allPIDs() {
		if pid == os.Getpid() {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
		if err == nil && bytes.Contains(cmdline, []byte(s)) && alive(pid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

func allPIDs() []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// alive says whether process pid exists and is not a zombie: a process
// whose parent is gone is reparented to an init that may be slow to reap
// it, or never does.
func alive(pid int) bool {
	stat, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return false
	}
	// pid (comm) state ...: comm may hold spaces and parentheses.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return false
	}
	fields := strings.Fields(string(stat[i+1:]))
	return len(fields) > 0 && fields[0] != "Z" && fields[0] != "X"
}
