// Package testenv gives tests their own PostgreSQL database and RabbitMQ
// virtual host, so that every test can run in parallel with every other
// test, in its own package or another, and leave nothing behind.
//
// The servers are the ones at DATABASE_URL and AMQP_URL (or the local
// defaults) when they answer. When one does not answer and its variable is
// not set, the package starts it in a container with testcontainers-go,
// once per test binary, so `make test` also works on a laptop that has
// Docker and nothing else. Under `go test -short` (make test/unit) every
// test that asks for a server here is skipped, saying so.
//
// A database is a copy of a template that holds the migrated schemas (the
// order service's, or only those a test names, such as outbox.Schema): the
// template is built once per version of those schemas (under an advisory
// lock, since test binaries run at the same time), and each NewDatabase is
// a cheap CREATE DATABASE ... TEMPLATE.
package testenv

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	mrand "math/rand/v2"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
	"github.com/testcontainers/testcontainers-go/wait"

	"github.com/yourorg/orders/internal/database"
)

const (
	defaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	postgresImage      = "postgres:15-alpine"
	// testDBPrefix names the databases tests create; older leftovers of
	// killed runs are dropped when a test binary first needs a database.
	testDBPrefix = "orders_test_"
	// templateLockID serialises the building of templates across binaries.
	templateLockID = 7_160_410_111
)

// Database is a fresh, migrated database that belongs to one test.
type Database struct {
	Name string
	// URL connects to this database as the server's superuser, the owner of
	// the schema: for a test's own setup and checks. Code under test
	// connects as its process's role (URLAs).
	URL string
	// Pool is a pool on URL, closed at the end of the test.
	Pool *pgxpool.Pool
}

// URLAs returns a URL of this database that connects as role, one of the
// roles of migrations/00008_roles.sql (migrations.RoleAPI, ...) or one of
// NewRole, so that
// the code under test has exactly the privileges of its process and a
// missing grant fails the test.
func (db *Database) URLAs(role string) string { return AsRole(db.URL, role) }

// AsRole returns rawURL with its user replaced by role and no password.
// The roles have none: the test server must trust them (a local server
// with trust authentication, or the container this package starts).
func AsRole(rawURL, role string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		return rawURL
	}
	u.User = url.User(role)
	return u.String()
}

var server struct {
	once      sync.Once
	adminURL  string // the server's maintenance database
	err       error
	templates templates
}

// startServer finds or starts the shared server, once per test binary.
func startServer(t testing.TB) {
	t.Helper()
	needsServers(t, "PostgreSQL")
	server.once.Do(func() { server.adminURL, server.err = postgresServer(context.Background()) })
	if server.err != nil {
		t.Fatalf("testenv: PostgreSQL: %v", server.err)
	}
}

// NewDatabase creates a database for t with schemas applied in order, and
// drops it when t ends: the order service's (migrations.Schemas...), or a
// mechanism's own (outbox.Schema), so that its tests need nothing of the
// service.
func NewDatabase(t testing.TB, schemas ...database.Schema) *Database {
	t.Helper()
	if len(schemas) == 0 {
		t.Fatal("testenv: NewDatabase: name the schemas (migrations.Schemas... for the order service's)")
	}
	startServer(t)
	ctx := context.Background()
	template := templateName(schemas)
	if err := server.templates.once(template, func() error { return prepareTemplate(ctx, template, schemas) }); err != nil {
		t.Fatalf("testenv: PostgreSQL: build the template database: %v", err)
	}

	name := testDBPrefix + strconv.FormatInt(time.Now().Unix(), 10) + "_" + randomSuffix()
	admin := connectAdmin(t, ctx)
	for try := 1; ; try++ {
		_, err := admin.Exec(ctx, fmt.Sprintf("CREATE DATABASE %s TEMPLATE %s", name, template))
		if err == nil {
			break
		}
		// Another test binary, of this checkout or another at another
		// schema version, may have dropped the template as a leftover
		// (older versions of this package did): build it again.
		var pgErr *pgconn.PgError
		if try == 3 || !errors.As(err, &pgErr) || (pgErr.Code != "3D000" && pgErr.Code != "55006") {
			t.Fatalf("testenv: create database: %v", err)
		}
		if err := prepareTemplate(ctx, template, schemas); err != nil {
			t.Fatalf("testenv: rebuild the template: %v", err)
		}
	}
	_ = admin.Close(ctx)

	db := &Database{Name: name, URL: withDatabase(server.adminURL, name)}
	pool, err := pgxpool.New(ctx, db.URL)
	if err != nil {
		t.Fatalf("testenv: connect to %s: %v", name, err)
	}
	db.Pool = pool
	t.Cleanup(func() {
		pool.Close()
		admin := connectAdmin(t, ctx)
		defer admin.Close(ctx)
		if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Errorf("testenv: drop database %s: %v", name, err)
		}
	})
	return db
}

// NewRole creates a login role of t's own, which may do nothing in db
// but what grants say (GRANT statements, run as the owner, with %s for
// the role), and returns its name; URLAs connects as it. The role is
// dropped when t ends, after the pools t opened on it are closed.
func (db *Database) NewRole(t testing.TB, grants ...string) string {
	t.Helper()
	ctx := context.Background()
	role := "orders_test_role_" + randomSuffix()
	if _, err := db.Pool.Exec(ctx, "CREATE ROLE "+role+" LOGIN"); err != nil {
		t.Fatalf("testenv: create role: %v", err)
	}
	t.Cleanup(func() {
		for _, stmt := range []string{"DROP OWNED BY " + role, "DROP ROLE " + role} {
			if _, err := db.Pool.Exec(ctx, stmt); err != nil {
				t.Errorf("testenv: %s: %v", stmt, err)
			}
		}
	})
	for _, g := range grants {
		if _, err := db.Pool.Exec(ctx, fmt.Sprintf(g, role)); err != nil {
			t.Fatalf("testenv: %s: %v", fmt.Sprintf(g, role), err)
		}
	}
	return role
}

// ServerURL returns a URL of the test PostgreSQL server with database name
// in it, for tests of code that creates its own database.
func ServerURL(t testing.TB, name string) string {
	t.Helper()
	startServer(t)
	return withDatabase(server.adminURL, name)
}

// DropDatabaseAtCleanup drops database name (if it exists) when t ends.
func DropDatabaseAtCleanup(t testing.TB, name string) {
	t.Helper()
	needsServers(t, "PostgreSQL")
	t.Cleanup(func() {
		ctx := context.Background()
		admin := connectAdmin(t, ctx)
		defer admin.Close(ctx)
		if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			t.Errorf("testenv: drop database %s: %v", name, err)
		}
	})
}

// TestDatabaseName returns a fresh name for a test database (for tests that
// create one themselves).
func TestDatabaseName() string {
	return testDBPrefix + strconv.FormatInt(time.Now().Unix(), 10) + "_" + randomSuffix()
}

func connectAdmin(t testing.TB, ctx context.Context) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(ctx, server.adminURL)
	if err != nil {
		t.Fatalf("testenv: connect to the PostgreSQL server: %v", err)
	}
	return conn
}

// templates are the template databases this test binary has made sure of,
// each once, by name.
type templates struct {
	mu    sync.Mutex
	built map[string]*templateResult
}

type templateResult struct {
	once sync.Once
	err  error
}

// once runs prepare the first time template is asked for, and returns its
// error every time.
func (ts *templates) once(template string, prepare func() error) error {
	ts.mu.Lock()
	if ts.built == nil {
		ts.built = map[string]*templateResult{}
	}
	r, ok := ts.built[template]
	if !ok {
		r = &templateResult{}
		ts.built[template] = r
	}
	ts.mu.Unlock()
	r.once.Do(func() { r.err = prepare() })
	return r.err
}

// prepareTemplate makes sure the shared server has template, with schemas
// applied, building it if missing.
func prepareTemplate(ctx context.Context, template string, schemas []database.Schema) error {
	conn, err := pgx.Connect(ctx, server.adminURL)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)

	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", templateLockID); err != nil {
		return err
	}
	defer func() { _, _ = conn.Exec(ctx, "SELECT pg_advisory_unlock($1)", templateLockID) }()

	dropLeftovers(ctx, conn, template)
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", template).Scan(&exists); err != nil {
		return err
	}
	if exists {
		return nil
	}
	if err := buildTemplate(ctx, conn, server.adminURL, template, schemas); err != nil {
		_, _ = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+template+" WITH (FORCE)")
		return err
	}
	return nil
}

func buildTemplate(ctx context.Context, conn *pgx.Conn, adminURL, template string, schemas []database.Schema) error {
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+template); err != nil {
		return err
	}
	pool, err := pgxpool.New(ctx, withDatabase(adminURL, template))
	if err != nil {
		return err
	}
	m, err := database.NewMigrator(pool, slog.New(slog.NewTextHandler(io.Discard, nil)), schemas...)
	if err != nil {
		pool.Close()
		return err
	}
	err = m.Up(ctx)
	_ = m.Close()
	pool.Close()
	if err != nil {
		return err
	}
	// No one may connect to a template: CREATE DATABASE ... TEMPLATE fails
	// while anyone is.
	if _, err = conn.Exec(ctx, "ALTER DATABASE "+template+" WITH is_template true allow_connections false"); err != nil {
		return err
	}
	// When it was built, so that another checkout at another schema
	// version (a branch, a worktree) leaves it alone for a day.
	_, err = conn.Exec(ctx, fmt.Sprintf("COMMENT ON DATABASE %s IS 'built %d'", template, time.Now().Unix()))
	return err
}

// dropLeftovers drops the test databases of runs that were killed before
// their cleanup (older than an hour), and templates of other schema
// versions built more than a day ago (another checkout on this machine may
// be testing with a newer one right now).
func dropLeftovers(ctx context.Context, conn *pgx.Conn, keep string) {
	rows, err := conn.Query(ctx, `SELECT datname, coalesce(shobj_description(oid, 'pg_database'), '') FROM pg_database
		WHERE datname LIKE 'orders_template_%' OR datname LIKE $1`, testDBPrefix+"%")
	if err != nil {
		return
	}
	type leftover struct{ name, comment string }
	dbs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (leftover, error) {
		var l leftover
		return l, r.Scan(&l.name, &l.comment)
	})
	if err != nil {
		return
	}
	cutoff := time.Now().Add(-time.Hour).Unix()
	for _, db := range dbs {
		name := db.name
		if strings.HasPrefix(name, testDBPrefix) {
			created, _, _ := strings.Cut(strings.TrimPrefix(name, testDBPrefix), "_")
			if ts, err := strconv.ParseInt(created, 10, 64); err != nil || ts > cutoff {
				continue
			}
		} else if name == keep {
			continue
		} else if built, err := strconv.ParseInt(strings.TrimPrefix(db.comment, "built "), 10, 64); err == nil && built > time.Now().Add(-24*time.Hour).Unix() {
			continue
		} else {
			_, _ = conn.Exec(ctx, "ALTER DATABASE "+name+" WITH is_template false")
		}
		_, _ = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
	}
}

// templateName names the template of schemas by a hash of their
// migrations, so that a changed migration gets a new template, and of
// the day.
func templateName(schemas []database.Schema) string {
	h := sha256.New()
	// The outbox's time partitions reach a few weeks past the migration
	// that made them: a template serves the day (UTC) it was built.
	h.Write([]byte(time.Now().UTC().Format(time.DateOnly) + "\x00"))
	for _, s := range schemas {
		h.Write([]byte(s.Name + "\x00" + s.VersionTable + "\x00"))
		_ = fs.WalkDir(s.FS, ".", func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			b, err := fs.ReadFile(s.FS, path)
			h.Write([]byte(path))
			h.Write(b)
			return err
		})
	}
	return "orders_template_" + hex.EncodeToString(h.Sum(nil))[:12]
}

// postgresServer returns the URL of the server's maintenance database:
// DATABASE_URL's server, or the local default when it answers, or a
// container.
func postgresServer(ctx context.Context) (string, error) {
	if env := os.Getenv("DATABASE_URL"); env != "" {
		if err := pingPostgres(ctx, withDatabase(env, "postgres")); err != nil {
			return "", fmt.Errorf("DATABASE_URL is set but the server does not answer: %w", err)
		}
		return withDatabase(env, "postgres"), nil
	}
	if pingPostgres(ctx, defaultDatabaseURL) == nil {
		return defaultDatabaseURL, nil
	}
	return startPostgresContainer(ctx)
}

func pingPostgres(ctx context.Context, connURL string) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, connURL)
	if err != nil {
		return err
	}
	return conn.Close(ctx)
}

func startPostgresContainer(ctx context.Context) (string, error) {
	ctr, err := tcpostgres.Run(ctx, postgresImage,
		tcpostgres.WithDatabase("postgres"),
		tcpostgres.WithUsername("postgres"),
		tcpostgres.WithPassword("postgres"),
		// The process roles (migrations/00008_roles.sql) have no password:
		// trust lets the tests connect as them (Database.URLAs).
		testcontainers.WithEnv(map[string]string{"POSTGRES_HOST_AUTH_METHOD": "trust"}),
		testcontainers.WithWaitStrategy(wait.ForLog("database system is ready to accept connections").
			WithOccurrence(2).WithStartupTimeout(60*time.Second)),
	)
	if err != nil {
		return "", fmt.Errorf("no PostgreSQL answers at %s, and starting one with testcontainers failed: %w", defaultDatabaseURL, err)
	}
	// The container lives as long as the test binary; testcontainers' reaper
	// removes it afterwards.
	return ctr.ConnectionString(ctx, "sslmode=disable")
}

// withDatabase returns rawURL with its database replaced by name.
func withDatabase(rawURL, name string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		return rawURL
	}
	u.Path = "/" + name
	return u.String()
}

func randomSuffix() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// FreeAddr returns a 127.0.0.1 address with a port that was free a moment
// ago, for a process under test to listen on.
func FreeAddr(t testing.TB) string {
	t.Helper()
	freePorts.Lock()
	defer freePorts.Unlock()
	for range 200 {
		// Below the kernel's ephemeral range (32768 and up here, and on
		// most Linux machines): a port from that range, free when it is
		// chosen, can be taken by any outgoing connection (to PostgreSQL,
		// RabbitMQ) before the process that was given it binds it.
		port := 20000 + mrand.IntN(12000)
		if freePorts.given[port] {
			continue
		}
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		ln, err := (&net.ListenConfig{}).Listen(context.Background(), "tcp", addr)
		if err != nil {
			continue // taken
		}
		if err := ln.Close(); err != nil {
			t.Fatal(err)
		}
		freePorts.given[port] = true
		return addr
	}
	t.Fatal("testenv: no free port found")
	return ""
}

// freePorts are the ports FreeAddr gave out in this process: never twice.
var freePorts = struct {
	sync.Mutex
	given map[int]bool
}{given: map[int]bool{}}
