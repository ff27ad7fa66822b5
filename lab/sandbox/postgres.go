package sandbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// Postgres is a PostgreSQL server of the caller's own, started from the
// installed binaries in a directory of its own on a free port: nothing
// else runs on it, so its server-wide figures (WAL written, fsyncs, CPU)
// are the caller's alone, and it loads pg_stat_statements, which the
// shared server does not.
type Postgres struct {
	// URL connects to its "postgres" database as its superuser, postgres,
	// without a password.
	URL string
	// PID is the postmaster's: its backends are its children.
	PID  int
	dir  string
	cmd  *exec.Cmd
	done chan struct{}
}

// PostgresSettings are the servers' settings beyond the defaults: what
// the statistics need, and the log-tailing relay's wal_level. Durability
// (fsync, synchronous_commit) stays at the defaults, so that the fsyncs
// counted are those a production server makes.
var PostgresSettings = []string{
	"shared_preload_libraries=pg_stat_statements",
	"pg_stat_statements.track=all",
	"track_io_timing=on",
	"wal_level=logical",
	"max_connections=300",
	"listen_addresses=127.0.0.1",
}

// StartPostgres runs initdb in a new temporary directory and starts
// postgres on it. As root, it runs them as the postgres user (PostgreSQL
// refuses root). Stop stops the server and removes its directory.
func StartPostgres(ctx context.Context) (*Postgres, error) {
	bin, err := postgresBinaries(ctx)
	if err != nil {
		return nil, err
	}
	asPostgres, err := postgresUser()
	if err != nil {
		return nil, err
	}
	home, err := os.MkdirTemp("", "sandbox-postgres-") // not under a directory only root may enter
	if err != nil {
		return nil, err
	}
	run := func(cmd *exec.Cmd) *exec.Cmd {
		cmd.Dir = home
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: asPostgres, Setpgid: true}
		return cmd
	}
	if asPostgres != nil {
		if err := os.Chown(home, int(asPostgres.Uid), int(asPostgres.Gid)); err != nil {
			return nil, err
		}
	}
	data := filepath.Join(home, "data")
	initdb := run(exec.CommandContext(ctx, filepath.Join(bin, "initdb"), "-D", data, "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync"))
	if out, err := initdb.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("initdb: %w\n%s", err, out)
	}
	addr, err := FreeAddr(ctx)
	if err != nil {
		return nil, err
	}
	_, port, _ := net.SplitHostPort(addr)
	args := []string{"-D", data, "-p", port, "-k", home}
	for _, s := range PostgresSettings {
		args = append(args, "-c", s)
	}
	logPath := filepath.Join(home, "postgres.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer func() { _ = logFile.Close() }() // postgres has its own descriptor
	// Not ctx: the server lives until Stop.
	cmd := run(exec.CommandContext(context.WithoutCancel(ctx), filepath.Join(bin, "postgres"), args...))
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start postgres: %w", err)
	}
	p := &Postgres{URL: "postgres://postgres@" + net.JoinHostPort("127.0.0.1", port) + "/postgres?sslmode=disable",
		PID: cmd.Process.Pid, dir: home, cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.done) }()
	deadline := time.Now().Add(60 * time.Second)
	for {
		if err := ping(ctx, p.URL); err == nil {
			return p, nil
		}
		select {
		case <-p.done:
			out, _ := os.ReadFile(logPath)
			return nil, fmt.Errorf("postgres exited while starting:\n%s", out)
		case <-ctx.Done():
			return nil, errors.Join(ctx.Err(), p.Stop())
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			out, _ := os.ReadFile(logPath)
			return nil, errors.Join(fmt.Errorf("postgres took no connection within 60s:\n%s", out), p.Stop())
		}
	}
}

// Stop shuts the server down (a fast shutdown, then SIGKILL after 30s)
// and removes its directory.
func (p *Postgres) Stop() error {
	_ = p.cmd.Process.Signal(os.Interrupt)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	return os.RemoveAll(p.dir)
}

// postgresBinaries is the directory of initdb and postgres: the newest of
// Debian's /usr/lib/postgresql/<version>/bin, else pg_config --bindir's.
func postgresBinaries(ctx context.Context) (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	version := func(dir string) float64 {
		v, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(dir)), 64)
		return v
	}
	slices.SortFunc(dirs, func(a, b string) int { return cmp.Compare(version(b), version(a)) })
	if out, err := exec.CommandContext(ctx, "pg_config", "--bindir").Output(); err == nil {
		dirs = append(dirs, strings.TrimSpace(string(out)))
	}
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	return "", errors.New("no PostgreSQL server binaries (initdb, postgres) in /usr/lib/postgresql/*/bin or pg_config --bindir")
}

// postgresUser is the user to run the server as when this process is
// root: the postgres user the server package created. Otherwise nil: the
// server runs as this process's user.
func postgresUser() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("PostgreSQL refuses to run as root, and there is no postgres user: %w", err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err := errors.Join(err1, err2); err != nil {
		return nil, err
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// ping connects to url and closes the connection.
func ping(ctx context.Context, url string) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	return conn.Close(ctx)
}
