package testenv

import (
	"os/exec"
	"runtime"
	"sync"
	"syscall"
)

// startTiedToTest starts cmd so that the kernel kills it when the test
// binary dies (a panic, a timeout): no node of a test cluster outlives its
// test. The kernel's "parent" is the thread that started the process, so
// every such process is started from one thread locked to a goroutine that
// never ends, and never from a thread the Go runtime might let go.
func startTiedToTest(cmd *exec.Cmd) error {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	done := make(chan error)
	starter() <- func() { done <- cmd.Start() }
	return <-done
}

var starter = sync.OnceValue(func() chan<- func() {
	ch := make(chan func())
	go func() {
		runtime.LockOSThread() // never unlocked: the thread lives as long as the binary
		for start := range ch {
			start()
		}
	}()
	return ch
})
