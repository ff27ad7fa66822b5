package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// PgBouncer is Debian's pgbouncer between a test and its database, in
// transaction pooling mode and otherwise with the pooler's default
// settings (no ignore_startup_parameters, no prepared statement support):
// what most teams put between their services and PostgreSQL. It listens on
// a free port of 127.0.0.1, in a temporary directory, and lets in every
// role that may log in to the server without a password (trust, as the
// test server does). When the test binary runs as root, pgbouncer runs as
// the postgres user: it refuses to run as root. t's cleanup stops it.
type PgBouncer struct {
	t    testing.TB
	bin  string
	dir  string
	addr string
	// asUser runs pgbouncer as the postgres user, when the test runs as root.
	asUser func(*exec.Cmd) error
	cmd    *exec.Cmd
	done   chan struct{}
}

// NewPgBouncer starts pgbouncer in front of the server of dbURL; URL
// rewrites a URL of that server to go through it. Without the pgbouncer
// binary the test skips and says so: .ci/run installs it.
func NewPgBouncer(t testing.TB, dbURL string) *PgBouncer {
	t.Helper()
	needsServers(t, "PostgreSQL and pgbouncer")
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		bin = "/usr/sbin/pgbouncer" // Debian's, not on an ordinary user's PATH
	}
	if !isExecutable(bin) {
		t.Skip("testenv: no pgbouncer binary (Debian's package pgbouncer; .ci/run installs it)")
	}
	dir, err := os.MkdirTemp("", "orders-pgbouncer-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	roles, err := loginRoles(dbURL)
	if err != nil {
		t.Fatalf("testenv: the roles pgbouncer lets in: %v", err)
	}
	var users strings.Builder
	for _, r := range roles {
		fmt.Fprintf(&users, "%q \"\"\n", r)
	}
	upstream := HostPort(dbURL)
	host, port, _ := net.SplitHostPort(upstream)
	p := &PgBouncer{t: t, bin: bin, dir: dir, addr: FreeAddr(t), asUser: func(*exec.Cmd) error { return nil }}
	_, listen, _ := net.SplitHostPort(p.addr)
	ini := fmt.Sprintf(`[databases]
* = host=%s port=%s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %s
unix_socket_dir = %s
auth_type = trust
auth_file = %s
pool_mode = transaction
logfile = %s
`, host, port, listen, dir, filepath.Join(dir, "users.txt"), filepath.Join(dir, "pgbouncer.log"))
	for name, content := range map[string]string{"pgbouncer.ini": ini, "users.txt": users.String()} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	uid, gid, asPostgres, err := postgresCredential()
	if err != nil {
		t.Fatal(err)
	}
	if asPostgres {
		if err := os.Chown(dir, int(uid), int(gid)); err != nil {
			t.Fatal(err)
		}
		p.asUser = func(cmd *exec.Cmd) error { return runAs(cmd, uid, gid) }
	}
	p.start()
	t.Cleanup(p.Stop)
	return p
}

// start runs pgbouncer and waits until it lets a connection through.
func (p *PgBouncer) start() {
	p.t.Helper()
	p.cmd = exec.CommandContext(context.Background(), p.bin, filepath.Join(p.dir, "pgbouncer.ini")) // Stop ends it
	p.cmd.Dir = p.dir
	if err := p.asUser(p.cmd); err != nil {
		p.t.Fatal(err)
	}
	if err := startTiedToTest(p.cmd); err != nil {
		p.t.Fatalf("testenv: start pgbouncer: %v", err)
	}
	p.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) { _ = cmd.Wait(); close(done) }(p.cmd, p.done)
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		conn, err := pgx.Connect(ctx, p.URL(ServerURL(p.t, "postgres")))
		cancel()
		if err == nil {
			_ = conn.Close(context.Background())
			return
		}
		select {
		case <-p.done:
			p.t.Fatalf("testenv: pgbouncer exited: %s", p.Log())
		default:
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("testenv: pgbouncer takes no connection after 10s: %v\n%s", err, p.Log())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// URL returns rawURL, a URL of the server behind the pooler, with the
// pooler's host and port.
func (p *PgBouncer) URL(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		p.t.Fatalf("testenv: %v", err)
	}
	u.Host = p.addr
	return u.String()
}

// Restart stops pgbouncer at once (SIGTERM: every client connection and
// transaction through it is cut), and after down starts it again on the
// same port; meanwhile connections to it are refused.
func (p *PgBouncer) Restart(down time.Duration) {
	p.t.Helper()
	p.Stop()
	time.Sleep(down)
	p.start()
}

// Stop stops pgbouncer at once and waits for it to exit.
func (p *PgBouncer) Stop() {
	if p.cmd.Process == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// Log is what pgbouncer has logged so far.
func (p *PgBouncer) Log() string {
	out, err := os.ReadFile(filepath.Join(p.dir, "pgbouncer.log"))
	if err != nil {
		return err.Error()
	}
	return string(out)
}

// loginRoles lists the roles that may log in to the server of dbURL.
func loginRoles(dbURL string) ([]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return nil, err
	}
	defer func() { _ = conn.Close(context.Background()) }()
	rows, err := conn.Query(ctx, "SELECT rolname FROM pg_roles WHERE rolcanlogin ORDER BY rolname")
	if err != nil {
		return nil, err
	}
	roles, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err == nil && len(roles) == 0 {
		err = errors.New("none")
	}
	return roles, err
}
