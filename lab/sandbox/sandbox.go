// Package sandbox runs the whole flow as processes on a database and a
// RabbitMQ vhost of its own, for the lab's commands that drive the real
// binaries against the local servers: lab/bench-flow (what an order costs)
// and lab/soak (what failures do to the promise). It builds the binaries
// from this checkout, names and removes the database and the vhost, and
// starts and stops the processes.
package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// Build compiles the commands in the folders named (relative to the
// module's root: "cmd/order-api", "lab/loadgen") into dir, each binary
// named after its folder, from the module of the working directory.
func Build(ctx context.Context, dir string, folders ...string) error {
	gomod, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil || strings.TrimSpace(string(gomod)) == "" || strings.TrimSpace(string(gomod)) == os.DevNull {
		return fmt.Errorf("run inside the repository (go env GOMOD: %q): %w", gomod, err)
	}
	args := []string{"build", "-o", dir + "/"}
	for _, f := range folders {
		args = append(args, "./"+path.Clean(f))
	}
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = filepath.Dir(strings.TrimSpace(string(gomod)))
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

// UniqueName is a fresh name for a database and a vhost: prefix, the Unix
// time, a random suffix.
func UniqueName(prefix string) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return prefix + strconv.FormatInt(time.Now().Unix(), 10) + "_" + hex.EncodeToString(b)
}

// WithPath returns raw with its path replaced by "/" + name: the database
// of a PostgreSQL URL, the vhost of an AMQP URL.
func WithPath(raw, name string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", err
	}
	u.Path = "/" + name
	u.RawPath = ""
	return u.String(), nil
}

// DropDatabase drops database name on the server of serverURL.
func DropDatabase(ctx context.Context, serverURL, name string) error {
	admin, err := WithPath(serverURL, "postgres")
	if err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	// A database with a replication slot (an outbox-relay in RELAY_MODE=wal)
	// cannot be dropped: its slots go first, once their relays have let go.
	for try := 0; ; try++ {
		_, err = conn.Exec(ctx, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = $1", name)
		if err == nil || try == 50 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("drop the replication slots of %s: %w", name, err)
	}
	_, err = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
	return err
}

// VhostAdmin adds and deletes RabbitMQ virtual hosts: through the
// management API when the broker has one (RABBITMQ_MANAGEMENT_URL, or port
// 15672 of the AMQP host with the AMQP user), else with rabbitmqctl on this
// machine.
type VhostAdmin struct {
	api  *url.URL // the management API; nil: rabbitmqctl
	user string
}

// NewVhostAdmin finds a way to manage the vhosts of the broker of amqpURL:
// the management API at mgmt (default: port 15672 of the AMQP host), or
// rabbitmqctl.
func NewVhostAdmin(ctx context.Context, amqpURL, mgmt string) (*VhostAdmin, error) {
	u, err := url.Parse(amqpURL)
	if err != nil {
		return nil, fmt.Errorf("AMQP_URL: %w", err)
	}
	a := &VhostAdmin{user: u.User.Username()}
	if mgmt == "" {
		mgmt = "http://" + net.JoinHostPort(u.Hostname(), "15672")
	}
	if m, err := url.Parse(mgmt); err == nil {
		if m.User == nil {
			m.User = u.User
		}
		a.api = m
		if a.do(ctx, http.MethodGet, "/api/overview", "") == nil {
			return a, nil
		}
	}
	a.api = nil
	if _, err := exec.LookPath("rabbitmqctl"); err != nil {
		return nil, fmt.Errorf("to make a vhost, this needs RabbitMQ's management API at %s or rabbitmqctl on this machine", mgmt)
	}
	return a, nil
}

// Add creates vhost and gives the AMQP user every permission on it.
func (a *VhostAdmin) Add(ctx context.Context, vhost string) error {
	if a.api == nil {
		if err := rabbitmqctl(ctx, "add_vhost", vhost); err != nil {
			return err
		}
		return rabbitmqctl(ctx, "set_permissions", "-p", vhost, a.user, ".*", ".*", ".*")
	}
	if err := a.do(ctx, http.MethodPut, "/api/vhosts/"+url.PathEscape(vhost), ""); err != nil {
		return err
	}
	return a.do(ctx, http.MethodPut, "/api/permissions/"+url.PathEscape(vhost)+"/"+url.PathEscape(a.user),
		`{"configure":".*","write":".*","read":".*"}`)
}

// Remove deletes vhost and everything in it.
func (a *VhostAdmin) Remove(ctx context.Context, vhost string) error {
	if a.api == nil {
		return rabbitmqctl(ctx, "delete_vhost", vhost)
	}
	return a.do(ctx, http.MethodDelete, "/api/vhosts/"+url.PathEscape(vhost), "")
}

// do calls the management API; the URL's user and password become Basic
// authentication.
func (a *VhostAdmin) do(ctx context.Context, method, path, body string) error {
	req, err := http.NewRequestWithContext(ctx, method, a.api.String()+path, strings.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		return fmt.Errorf("%s %s: %s", method, path, resp.Status)
	}
	return nil
}

func rabbitmqctl(ctx context.Context, args ...string) error {
	out, err := exec.CommandContext(ctx, "rabbitmqctl", append([]string{"--quiet"}, args...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("rabbitmqctl %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

// Process is one service started by Start.
type Process struct {
	Name string
	Cmd  *exec.Cmd
	Log  string // the file its output goes to
	done chan error
}

// Start runs bin with env added to the caller's environment, its output
// to logDir/name.log, and waits until GET ready answers 200. When ctx ends
// the process gets SIGTERM, and SIGKILL 20s later.
func Start(ctx context.Context, name, bin, ready, logDir string, env ...string) (*Process, error) {
	p := &Process{Name: name, Log: filepath.Join(logDir, name+".log"), done: make(chan error, 1)}
	out, err := os.Create(p.Log)
	if err != nil {
		return nil, err
	}
	defer func() { _ = out.Close() }() // the child has its own copy
	p.Cmd = exec.CommandContext(ctx, bin)
	p.Cmd.Cancel = func() error { return p.Cmd.Process.Signal(syscall.SIGTERM) }
	p.Cmd.WaitDelay = 20 * time.Second
	p.Cmd.Env = append(os.Environ(), env...)
	p.Cmd.Stdout, p.Cmd.Stderr = out, out
	if err := p.Cmd.Start(); err != nil {
		return nil, err
	}
	go func() { p.done <- p.Cmd.Wait() }()

	deadline := time.Now().Add(30 * time.Second)
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, ready, nil)
		if err != nil {
			return p, err
		}
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p, nil
			}
		}
		select {
		case err := <-p.done:
			p.done <- err
			return p, fmt.Errorf("%s exited before it was ready (its log: %s): %w", name, p.Log, err)
		case <-ctx.Done():
			return p, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return p, fmt.Errorf("%s was not ready within 30s; its log: %s", name, p.Log)
		}
	}
}

// Stop ends the process gracefully (SIGTERM), or kills it after 20s.
func (p *Process) Stop() error {
	_ = p.Cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.done:
		// context.Canceled: the caller was interrupted, and the process
		// stopped cleanly on the SIGTERM that followed.
		if err != nil && !errors.Is(err, context.Canceled) {
			return fmt.Errorf("%s: %w (its log: %s)", p.Name, err, p.Log)
		}
		return nil
	case <-time.After(20 * time.Second):
		_ = p.Cmd.Process.Kill()
		return fmt.Errorf("%s did not stop within 20s of SIGTERM (its log: %s): %w", p.Name, p.Log, <-p.done)
	}
}

// Kill ends the process at once (SIGKILL), as a crash or an OOM kill
// would, and returns what its wait returned ("signal: killed", unless it
// had exited before).
func (p *Process) Kill() error {
	_ = p.Cmd.Process.Kill()
	return <-p.done
}

// FreeAddr returns a 127.0.0.1 address whose port was free a moment ago.
func FreeAddr(ctx context.Context) (string, error) {
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	addr := ln.Addr().String()
	return addr, ln.Close()
}

// BuildRevision compiles the commands in folders, as Build does, from the
// module as it was at git revision rev (a commit, a branch, a tag of the
// working directory's repository), into dir. The sources go to a new
// directory under tmp, which is removed afterwards.
func BuildRevision(ctx context.Context, rev, dir, tmp string, folders ...string) error {
	src, err := os.MkdirTemp(tmp, "src-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(src) }()
	top, err := exec.CommandContext(ctx, "git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		return fmt.Errorf("run inside the repository's git checkout (git rev-parse --show-toplevel): %w", err)
	}
	// From the top: in a subfolder, git archive takes that folder only.
	archive := exec.CommandContext(ctx, "git", "archive", "--format=tar", rev)
	archive.Dir = strings.TrimSpace(string(top))
	extract := exec.CommandContext(ctx, "tar", "-x", "-C", src)
	pipe, err := archive.StdoutPipe()
	if err != nil {
		return err
	}
	extract.Stdin = pipe
	var archiveErr strings.Builder
	archive.Stderr = &archiveErr
	if err := archive.Start(); err != nil {
		return err
	}
	out, extractErr := extract.CombinedOutput()
	if err := archive.Wait(); err != nil {
		return fmt.Errorf("git archive %s: %w: %s", rev, err, archiveErr.String())
	}
	if extractErr != nil {
		return fmt.Errorf("tar -x of git archive %s: %w: %s", rev, extractErr, out)
	}
	args := []string{"build", "-o", dir + "/"}
	for _, f := range folders {
		args = append(args, "./"+path.Clean(f))
	}
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = src
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go %s (at %s): %w\n%s", strings.Join(args, " "), rev, err, out)
	}
	return nil
}
