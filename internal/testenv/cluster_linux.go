package testenv

import (
	"os/exec"
	"runtime"
	"sync"
	"syscall"
)

// startTiedToTest starts cmd so that the kernel kills it when the test
// binary dies (a panic, a timeout): no node of a test cluster, and no test
// PostgreSQL, outlives its test binary. The kernel's "parent" is the thread
// that started the process, so every such process is started from one
// thread locked to a goroutine that never ends, and never from a thread the
// Go runtime might let go. It keeps what cmd.SysProcAttr says already (a
// user to run as, runAs): the kernel would clear the death signal of a
// process that changes user after asking for it, but Go changes the user
// first.
func startTiedToTest(cmd *exec.Cmd) error {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	done := make(chan error)
	starter() <- func() { done <- cmd.Start() }
	return <-done
}

var starter = sync.OnceValue(func() chan<- func() {
	ch := make(chan func())
	go runStarts(ch)
	return ch
})

// runStarts runs the starts of startTiedToTest on a thread of its own for
// as long as the binary lives: VerifyNoLeaks knows it by its name.
func runStarts(ch <-chan func()) {
	runtime.LockOSThread() // never unlocked: the thread lives as long as the binary
	for start := range ch {
		start()
	}
}

// runAs makes cmd run as the user uid, group gid, with no supplementary
// groups: a test binary running as root starts PostgreSQL as the postgres
// user, since PostgreSQL refuses to run as root.
func runAs(cmd *exec.Cmd, uid, gid uint32) error {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uid, Gid: gid}
	return nil
}
