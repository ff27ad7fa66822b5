package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
)

// runner is the testing.TB that testenv's Patroni cluster and the
// failover harness report to, outside a test: it prints what they log,
// remembers that something failed, and runs their cleanups at the end.
// Fatal ends the goroutine that calls it (runtime.Goexit, as a test's
// FailNow does): run calls the campaign in a goroutine of its own.
type runner struct {
	testing.TB // nil: the methods the harness calls are below; another one panics

	ctx  context.Context
	name string
	out  io.Writer

	mu       sync.Mutex
	failed   bool
	errs     []string
	cleanups []func()
}

func newRunner(ctx context.Context, name string, out io.Writer) *runner {
	return &runner{ctx: ctx, name: name, out: out}
}

func (r *runner) Helper()                    {}
func (r *runner) Name() string               { return r.name }
func (r *runner) Context() context.Context   { return r.ctx }
func (r *runner) Log(args ...any)            { r.print(fmt.Sprintln(args...)) }
func (r *runner) Logf(f string, args ...any) { r.print(fmt.Sprintf(f, args...)) }

func (r *runner) Error(args ...any) { r.fail(fmt.Sprintln(args...)) }
func (r *runner) Errorf(f string, args ...any) {
	r.fail(fmt.Sprintf(f, args...))
}

func (r *runner) Fatal(args ...any) { r.fail(fmt.Sprintln(args...)); runtime.Goexit() }
func (r *runner) Fatalf(f string, args ...any) {
	r.fail(fmt.Sprintf(f, args...))
	runtime.Goexit()
}

// A skip is what testenv does when Patroni, etcd or PostgreSQL 15 is
// missing: here it fails the run, saying so.
func (r *runner) Skip(args ...any) { r.Fatal(args...) }
func (r *runner) Skipf(f string, args ...any) {
	r.Fatalf(f, args...)
}

func (r *runner) Fail()    { r.fail("") }
func (r *runner) FailNow() { r.fail(""); runtime.Goexit() }
func (r *runner) Failed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failed
}

func (r *runner) TempDir() string {
	dir, err := os.MkdirTemp("", "failover-")
	if err != nil {
		r.Fatal(err)
	}
	r.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

func (r *runner) Cleanup(f func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cleanups = append(r.cleanups, f)
}

// cleanup runs the cleanups, the last registered first, once.
func (r *runner) cleanup() {
	r.mu.Lock()
	fs := r.cleanups
	r.cleanups = nil
	r.mu.Unlock()
	for _, f := range slices.Backward(fs) {
		f()
	}
}

// errors are the failures reported, in order.
func (r *runner) errors() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.errs)
}

func (r *runner) fail(msg string) {
	r.mu.Lock()
	r.failed = true
	if msg != "" {
		r.errs = append(r.errs, msg)
	}
	r.mu.Unlock()
	if msg != "" {
		r.print("FAIL: " + msg)
	}
}

func (r *runner) print(msg string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, _ = io.WriteString(r.out, r.name+": "+strings.TrimRight(msg, "\n")+"\n")
}
