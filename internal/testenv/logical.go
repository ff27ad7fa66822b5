package testenv

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
	"github.com/testcontainers/testcontainers-go/wait"

	"github.com/yourorg/orders/internal/database"
)

// LogicalServer is a PostgreSQL server of this test binary's own, with
// wal_level=logical, for the tests of what reads the write-ahead log
// through logical replication (pgoutput): the log-tailing outbox relay.
// The shared server (DATABASE_URL, or 127.0.0.1:5432) runs with
// wal_level=replica, and every test package uses it at the same time, so no
// test may restart it with another wal_level; this one is started from
// PostgreSQL's installed binaries (initdb, postgres) on a free port, in a
// temporary directory, once per test binary, and stopped by
// StopLogicalPostgres (VerifyNoLeaks calls it after the tests). On Linux it
// also dies with the test binary (a panic, a timeout). Where the binaries
// are not installed and DATABASE_URL is not set, it is a postgres:15-alpine
// container instead.
//
// It trusts every local connection, as the shared test server does, so a
// test connects as any role of migrations/00008_roles.sql without a
// password (Database.URLAs).
//
// Its tests share it, and one thing of a server is not per database:
// creating a logical replication slot waits until every transaction open
// on the server when it began has ended, in whatever database. A test that
// leaves a transaction open (idle in transaction) holds up the slot
// creations of every other test until it ends it.
type LogicalServer struct {
	// AdminURL connects to its "postgres" database as its superuser,
	// postgres.
	AdminURL string
	// Port is the TCP port it listens on, on 127.0.0.1 (or, for a
	// container, the port mapped to the container's).
	Port int

	dir       string        // the temporary directory of its data, socket and log; "" for a container
	cmd       *exec.Cmd     // the postmaster, nil for a container
	exited    chan struct{} // closed when cmd has exited
	container testcontainers.Container

	templates templates // the migrated template databases, each built by the first NewDatabase of its schemas
}

// The time limits of the fixture: a start takes two to four seconds here,
// most of it initdb, on a machine that runs other test suites beside it,
// but a busier one is slower.
const (
	logicalInitTimeout  = 2 * time.Minute
	logicalStartTimeout = 30 * time.Second
	// logicalStopTimeout bounds a fast shutdown (SIGINT) before the
	// postmaster is killed: with fsync off there is nothing to wait for.
	logicalStopTimeout = 10 * time.Second
	// logicalDirPrefix names the temporary directories of these servers,
	// so that those of killed test binaries are found and removed.
	logicalDirPrefix = "orders-logical-pg-"
	logicalOwnerFile = "owner.pid" // the pid of the test binary that owns a directory
)

// logicalSettings are the server's settings beyond initdb's. The first are
// what logical decoding needs, with room for a test per slot and sender;
// logical_decoding_work_mem at its minimum makes a transaction of a few
// rows spill to disk, as a big one would in production; wal_sender_timeout
// is short so a relay that stops reading is dropped within a test's time.
// The others trade durability, which a test server does not need, for
// speed, as the shared test servers do.
var logicalSettings = []string{
	"-c", "wal_level=logical",
	"-c", "max_replication_slots=32",
	"-c", "max_wal_senders=32",
	"-c", "logical_decoding_work_mem=64kB",
	"-c", "wal_sender_timeout=10s",
	"-c", "max_connections=200",
	"-c", "fsync=off",
	"-c", "synchronous_commit=off",
	"-c", "full_page_writes=off",
	"-c", "shared_buffers=32MB",
}

// logical is this test binary's LogicalServer: none until a test asks for
// it, and none again after StopLogicalPostgres, so that a later test starts
// another. A failure to start is kept, so that the tests after the first
// fail at once rather than each waiting out its own attempt.
var logical struct {
	mu  sync.Mutex
	srv *LogicalServer
	err error
}

// LogicalPostgres returns this test binary's PostgreSQL with
// wal_level=logical, starting it when it is the first to ask (t.Log says
// how long that took; the tests that call it at the same time wait for
// it). The server outlives t: it runs until StopLogicalPostgres, so that
// every test of the binary shares one start. Under -short t is skipped, as
// by NewDatabase. Where neither PostgreSQL's binaries nor a container can
// be had, t fails, saying what is missing.
func LogicalPostgres(t testing.TB) *LogicalServer {
	t.Helper()
	needsServers(t, "PostgreSQL with wal_level=logical")
	logical.mu.Lock()
	defer logical.mu.Unlock()
	if logical.srv == nil && logical.err == nil {
		started := time.Now()
		logical.srv, logical.err = startLogical(t)
		if logical.err == nil {
			t.Logf("testenv: PostgreSQL with wal_level=logical up in %s on port %d",
				time.Since(started).Round(10*time.Millisecond), logical.srv.Port)
		}
	}
	if logical.err != nil {
		t.Fatalf("testenv: PostgreSQL with wal_level=logical: %v", logical.err)
	}
	return logical.srv
}

// StopLogicalPostgres stops this test binary's LogicalServer, if one was
// started, and removes its directory (or its container). VerifyNoLeaks
// calls it after the tests, before it looks for goroutines left running;
// a package with a TestMain of its own calls it after m.Run. It writes
// what goes wrong to stderr, as there is no test left to fail.
func StopLogicalPostgres() {
	logical.mu.Lock()
	defer logical.mu.Unlock()
	if logical.srv != nil {
		if err := logical.srv.stop(); err != nil {
			fmt.Fprintf(os.Stderr, "testenv: stop PostgreSQL with wal_level=logical: %v\n", err)
		}
	}
	logical.srv, logical.err = nil, nil
}

// NewDatabase creates a database for t on this server, with schemas, and
// drops it when t ends, as testenv.NewDatabase
// does on the shared server: a copy of a template migrated once per server
// and schemas, so that each database costs a CREATE DATABASE ... TEMPLATE.
// The cleanup ends the database's replication connections and drops its
// replication slots first, which DROP DATABASE would otherwise refuse, so
// a test that leaves a slot behind still leaves nothing.
func (s *LogicalServer) NewDatabase(t testing.TB, schemas ...database.Schema) *Database {
	t.Helper()
	if len(schemas) == 0 {
		t.Fatal("testenv: NewDatabase: name the schemas (migrations.Schemas... for the order service's)")
	}
	ctx := context.Background()
	template := templateName(schemas)
	if err := s.templates.once(template, func() error { return s.buildTemplate(ctx, template, schemas) }); err != nil {
		t.Fatalf("testenv: PostgreSQL with wal_level=logical: build the template database: %v", err)
	}

	name := TestDatabaseName()
	admin := s.connect(t, ctx)
	if _, err := admin.Exec(ctx, fmt.Sprintf("CREATE DATABASE %s TEMPLATE %s", name, template)); err != nil {
		_ = admin.Close(ctx)
		t.Fatalf("testenv: create database: %v", err)
	}
	_ = admin.Close(ctx)

	db := &Database{Name: name, URL: withDatabase(s.AdminURL, name)}
	pool, err := pgxpool.New(ctx, db.URL)
	if err != nil {
		t.Fatalf("testenv: connect to %s: %v", name, err)
	}
	db.Pool = pool
	t.Cleanup(func() {
		pool.Close()
		if err := s.dropDatabase(ctx, name); err != nil {
			t.Errorf("testenv: drop database %s: %v", name, err)
		}
	})
	return db
}

// Terminate ends the sessions on database name whose application_name is
// app, or all of them when app is "", with pg_terminate_backend (from a
// session of its own, on the "postgres" database): what a client sees when
// an administrator or a failover ends its session. A log-tailing relay's
// replication connection is one of them (its application_name is whatever
// the relay set). It returns how many sessions it ended, once they have
// exited (up to five seconds each), so that the test goes on knowing they
// are gone.
func (s *LogicalServer) Terminate(t testing.TB, name, app string) int {
	t.Helper()
	ctx := context.Background()
	admin := s.connect(t, ctx)
	defer admin.Close(ctx)
	var n int
	err := admin.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 5000))
		FROM pg_stat_activity
		WHERE datname = $1 AND ($2 = '' OR application_name = $2) AND pid <> pg_backend_pid()`, name, app).Scan(&n)
	if err != nil {
		t.Fatalf("testenv: terminate the sessions of %s: %v", name, err)
	}
	return n
}

func (s *LogicalServer) connect(t testing.TB, ctx context.Context) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(ctx, s.AdminURL)
	if err != nil {
		t.Fatalf("testenv: connect to PostgreSQL with wal_level=logical: %v", err)
	}
	return conn
}

// buildTemplate migrates a template database as prepareTemplate does on
// the shared server, without its advisory lock and leftovers: the server
// is this binary's alone, and new.
func (s *LogicalServer) buildTemplate(ctx context.Context, template string, schemas []database.Schema) error {
	conn, err := pgx.Connect(ctx, s.AdminURL)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	if err := buildTemplate(ctx, conn, s.AdminURL, template, schemas); err != nil {
		_, _ = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+template+" WITH (FORCE)")
		return err
	}
	return nil
}

// dropDatabase drops database name and its replication slots. DROP
// DATABASE refuses while a slot of the database exists, and a slot cannot
// be dropped while a walsender holds it: the database's sessions are ended
// first, and the slots dropped once they are free (a terminated walsender
// lets go of its slot as it exits, a moment later).
func (s *LogicalServer) dropDatabase(ctx context.Context, name string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, s.AdminURL)
	if err != nil {
		return err
	}
	defer admin.Close(ctx)
	for {
		var slots int
		if err := admin.QueryRow(ctx, "SELECT count(*) FROM pg_replication_slots WHERE database = $1", name).Scan(&slots); err != nil {
			return err
		}
		if slots == 0 {
			break
		}
		_, _ = admin.Exec(ctx, `SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity
			WHERE datname = $1 AND pid <> pg_backend_pid()`, name)
		_, err := admin.Exec(ctx, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = $1 AND NOT active", name)
		if ctx.Err() != nil {
			return fmt.Errorf("drop its %d replication slots: %w", slots, errors.Join(err, ctx.Err()))
		}
		if err != nil {
			time.Sleep(50 * time.Millisecond) // a slot taken again between the query and the drop
		}
	}
	_, err = admin.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
	return err
}

// startLogical starts a server from the installed binaries, or, where
// there are none, a container if this machine may start one: when
// DATABASE_URL is not set, as postgres.go does for the shared server. When
// it is set, the tests were pointed at a server of their own (a CI
// service), where a container is not what was asked for.
func startLogical(t testing.TB) (*LogicalServer, error) {
	bin, err := postgresBinaries()
	if err != nil {
		if os.Getenv("DATABASE_URL") != "" {
			return nil, fmt.Errorf("PostgreSQL's initdb and postgres are not installed on this machine (%v), "+
				"and no container is started while DATABASE_URL is set: install the PostgreSQL server package "+
				"(postgresql-15 on Debian and Ubuntu), or unset DATABASE_URL on a machine with Docker", err)
		}
		return startLogicalContainer(context.Background(), err)
	}
	return startLogicalProcess(t, bin)
}

// postgresBinaries returns the directory of initdb and postgres: pg_config
// --bindir's, else the newest of Debian's /usr/lib/postgresql/<version>/bin,
// else the one of postgres on the PATH (Homebrew, a source build).
func postgresBinaries() (string, error) {
	var dirs []string
	if out, err := exec.CommandContext(context.Background(), "pg_config", "--bindir").Output(); err == nil {
		dirs = append(dirs, strings.TrimSpace(string(out)))
	}
	debian, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	version := func(dir string) float64 {
		v, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(dir)), 64)
		return v
	}
	slices.SortFunc(debian, func(a, b string) int { return cmp.Compare(version(b), version(a)) })
	dirs = append(dirs, debian...)
	if path, err := exec.LookPath("postgres"); err == nil {
		dirs = append(dirs, filepath.Dir(path))
	}
	for _, dir := range dirs {
		if isExecutable(filepath.Join(dir, "initdb")) && isExecutable(filepath.Join(dir, "postgres")) {
			return dir, nil
		}
	}
	return "", errors.New("no directory with initdb and postgres: not pg_config --bindir's, not /usr/lib/postgresql/*/bin, not the PATH's")
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// postgresCredential returns the user to run initdb and postgres as, when
// this binary runs as root: PostgreSQL refuses to run as root, so the
// postgres user the server package created. Otherwise, it returns ok
// false: the processes run as this binary's user.
func postgresCredential() (uid, gid uint32, ok bool, err error) {
	if os.Geteuid() != 0 {
		return 0, 0, false, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return 0, 0, false, fmt.Errorf("PostgreSQL refuses to run as root, and there is no postgres user to run it as: %w", err)
	}
	id, err1 := strconv.ParseUint(u.Uid, 10, 32)
	group, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err := errors.Join(err1, err2); err != nil {
		return 0, 0, false, fmt.Errorf("the postgres user: %w", err)
	}
	return uint32(id), uint32(group), true, nil
}

// startLogicalProcess runs initdb in a new temporary directory and starts
// postgres on it, on a free port of 127.0.0.1 and with its socket in the
// same directory: nothing of it is shared with the system's server.
func startLogicalProcess(t testing.TB, bin string) (srv *LogicalServer, err error) {
	uid, gid, asPostgres, err := postgresCredential()
	if err != nil {
		return nil, err
	}
	removeLogicalLeftovers()
	dir, err := os.MkdirTemp("", logicalDirPrefix+"*")
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(dir)
		}
	}()
	if err := os.WriteFile(filepath.Join(dir, logicalOwnerFile), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return nil, err
	}
	asUser := func(cmd *exec.Cmd) error {
		cmd.Dir = dir
		if !asPostgres {
			return nil
		}
		return runAs(cmd, uid, gid)
	}
	if asPostgres {
		if err := os.Chown(dir, int(uid), int(gid)); err != nil {
			return nil, err
		}
	}

	data := filepath.Join(dir, "data")
	ctx, cancel := context.WithTimeout(context.Background(), logicalInitTimeout)
	defer cancel()
	initdb := exec.CommandContext(ctx, filepath.Join(bin, "initdb"),
		"-D", data, "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync")
	if err := asUser(initdb); err != nil {
		return nil, err
	}
	if out, err := initdb.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("initdb: %w: %s", err, tail3k(out))
	}

	// A port that was free a moment ago can be taken before postgres binds
	// it: then postgres exits at once, saying so, and another port is tried.
	for try := 1; ; try++ {
		_, port, _ := net.SplitHostPort(FreeAddr(t))
		srv, err = startPostmaster(bin, dir, port, asUser)
		if !errors.Is(err, errPortTaken) || try == 5 {
			return srv, err
		}
	}
}

var errPortTaken = errors.New("port taken")

// startPostmaster starts postgres on the data directory of dir, tied to
// the test binary, and waits until it takes connections. Its log (stderr)
// goes to dir/postgres.log, and into the error when it does not start.
func startPostmaster(bin, dir, port string, asUser func(*exec.Cmd) error) (*LogicalServer, error) {
	logPath := filepath.Join(dir, "postgres.log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, err
	}
	defer func() { _ = logFile.Close() }() // postgres has its own descriptor
	args := append([]string{"-D", filepath.Join(dir, "data"), "-p", port, "-k", dir,
		"-c", "listen_addresses=127.0.0.1"}, logicalSettings...)
	// Not the test's context: the server outlives the test that started it.
	cmd := exec.CommandContext(context.Background(), filepath.Join(bin, "postgres"), args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := asUser(cmd); err != nil {
		return nil, err
	}
	if err := startTiedToTest(cmd); err != nil {
		return nil, fmt.Errorf("start postgres: %w", err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	portNum, _ := strconv.Atoi(port)
	srv := &LogicalServer{
		AdminURL: "postgres://postgres@" + net.JoinHostPort("127.0.0.1", port) + "/postgres?sslmode=disable",
		Port:     portNum,
		dir:      dir,
		cmd:      cmd,
		exited:   exited,
	}

	deadline := time.Now().Add(logicalStartTimeout)
	for {
		if pingPostgres(context.Background(), srv.AdminURL) == nil {
			return srv, nil
		}
		select {
		case <-exited:
			out, _ := os.ReadFile(logPath)
			if strings.Contains(string(out), "Address already in use") {
				return nil, errPortTaken
			}
			return nil, fmt.Errorf("postgres exited while starting: %s", tail3k(out))
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			out, _ := os.ReadFile(logPath)
			_ = srv.stop() // and its directory with it
			return nil, fmt.Errorf("postgres took no connection on port %s within %s: %s", port, logicalStartTimeout, tail3k(out))
		}
	}
}

// startLogicalContainer starts the server as a container, where the
// binaries are not installed (why says so): the image of the shared
// server's container, with the settings of logicalSettings. The container
// lives until StopLogicalPostgres, or until testcontainers' reaper removes
// it after the test binary.
func startLogicalContainer(ctx context.Context, why error) (*LogicalServer, error) {
	ctr, err := tcpostgres.Run(ctx, postgresImage,
		tcpostgres.WithDatabase("postgres"),
		tcpostgres.WithUsername("postgres"),
		tcpostgres.WithPassword("postgres"),
		// As for the shared server's container: the process roles have no
		// password (Database.URLAs).
		testcontainers.WithEnv(map[string]string{"POSTGRES_HOST_AUTH_METHOD": "trust"}),
		// After the module's "postgres -c fsync=off".
		testcontainers.WithCmdArgs(logicalSettings...),
		testcontainers.WithWaitStrategy(wait.ForLog("database system is ready to accept connections").
			WithOccurrence(2).WithStartupTimeout(60*time.Second)),
	)
	if err != nil {
		if ctr != nil {
			_ = testcontainers.TerminateContainer(ctr)
		}
		return nil, fmt.Errorf("PostgreSQL is not installed on this machine (%w), and starting %s with testcontainers failed: %w", why, postgresImage, err)
	}
	adminURL, err := ctr.ConnectionString(ctx, "sslmode=disable")
	if err != nil {
		_ = testcontainers.TerminateContainer(ctr)
		return nil, err
	}
	u, err := url.Parse(adminURL)
	if err != nil {
		_ = testcontainers.TerminateContainer(ctr)
		return nil, err
	}
	port, _ := strconv.Atoi(u.Port())
	return &LogicalServer{AdminURL: withDatabase(adminURL, "postgres"), Port: port, container: ctr}, nil
}

// stop shuts the server down and removes its directory: a fast shutdown
// (SIGINT: the sessions are ended, no checkpoint is waited for with fsync
// off), then SIGKILL if that takes too long.
func (s *LogicalServer) stop() error {
	if s.container != nil {
		return testcontainers.TerminateContainer(s.container)
	}
	if s.cmd != nil {
		if err := s.cmd.Process.Signal(os.Interrupt); err != nil {
			_ = s.cmd.Process.Kill()
		}
		select {
		case <-s.exited:
		case <-time.After(logicalStopTimeout):
			_ = s.cmd.Process.Kill()
			<-s.exited
		}
	}
	return os.RemoveAll(s.dir)
}

// removeLogicalLeftovers removes the directories of servers whose test
// binary has gone without stopping them (killed, or a package without
// VerifyNoLeaks): each is 40 MB or more. Its postgres died with the binary on
// Linux; elsewhere it notices its lock file gone within a minute and
// stops. A directory without an owner yet is one being created, left
// alone unless it is an hour old.
func removeLogicalLeftovers() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), logicalDirPrefix+"*"))
	for _, dir := range dirs {
		b, err := os.ReadFile(filepath.Join(dir, logicalOwnerFile))
		if err != nil {
			if fi, err := os.Stat(dir); err == nil && time.Since(fi.ModTime()) > time.Hour {
				_ = os.RemoveAll(dir)
			}
			continue
		}
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid != os.Getpid() && !processAlive(pid) {
			_ = os.RemoveAll(dir)
		}
	}
}

// processAlive reports whether process pid exists. Where that cannot be
// told (signal 0 is not supported), it says yes: a directory is kept
// rather than removed under a running server.
func processAlive(pid int) bool {
	p, err := os.FindProcess(pid)
	if err != nil {
		return false
	}
	defer func() { _ = p.Release() }()
	return !errors.Is(p.Signal(syscall.Signal(0)), os.ErrProcessDone)
}
