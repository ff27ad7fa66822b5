// Package scripts_test checks the shell scripts of make dev, make stop and
// the .env loader that the Makefile's run targets use.
package scripts_test

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/yourorg/orders/internal/config"
)

// environ runs scripts/env.sh env with extra variables and returns the
// environment the command saw, and what env.sh said on stderr.
func environ(t *testing.T, extra ...string) (map[string]string, string) {
	t.Helper()
	cmd := exec.Command("./env.sh", "env")
	cmd.Env = append(os.Environ(), extra...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("env.sh env: %v\n%s", err, stderr.String())
	}
	vars := map[string]string{}
	for line := range strings.Lines(stdout.String()) {
		name, value, _ := strings.Cut(strings.TrimSuffix(line, "\n"), "=")
		vars[name] = value
	}
	return vars, stderr.String()
}

// .env's settings reach the command, under the environment's: comments,
// blank lines, quotes and `export` as docker compose reads them.
func TestEnvFileUnderTheEnvironment(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), ".env")
	body := "# a comment\n\nDOTENV_TEST_A=from-file\nDOTENV_TEST_B=\"two words\"\nexport DOTENV_TEST_C='c'\nDOTENV_TEST_D=x=y#z\nnot a setting\n"
	if err := os.WriteFile(file, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	vars, said := environ(t, "DOTENV="+file, "DOTENV_TEST_A=from-shell")
	for name, want := range map[string]string{
		"DOTENV_TEST_A": "from-shell", "DOTENV_TEST_B": "two words", "DOTENV_TEST_C": "c", "DOTENV_TEST_D": "x=y#z",
	} {
		if vars[name] != want {
			t.Errorf("%s = %q, want %q", name, vars[name], want)
		}
	}
	if !strings.Contains(said, "not a setting") || !strings.Contains(said, "3 settings from "+file) {
		t.Errorf("env.sh did not say what it read and skipped:\n%s", said)
	}

	vars, _ = environ(t, "DOTENV=none")
	if _, ok := vars["DOTENV_TEST_B"]; ok {
		t.Errorf("DOTENV=none read a file")
	}
}

// .env.example, copied to .env, loads whole: every line is a comment, blank
// or a setting env.sh takes.
func TestEnvExampleLoads(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../.env.example")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, value, _ := strings.Cut(line, "=")
		want[name] = value
	}
	// Unset every one of them, so that the file's values show.
	var extra []string
	for _, kv := range os.Environ() {
		if name, _, _ := strings.Cut(kv, "="); !listed(want, name) {
			extra = append(extra, kv)
		}
	}
	cmd := exec.Command("./env.sh", "env")
	cmd.Env = append(extra, "DOTENV=../.env.example")
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for line := range strings.Lines(string(out)) {
		name, value, _ := strings.Cut(strings.TrimSuffix(line, "\n"), "=")
		got[name] = value
	}
	for name, value := range want {
		if v, ok := got[name]; !ok || v != value {
			t.Errorf("%s: got %q, want %q from .env.example", name, v, value)
		}
	}
}

func listed(m map[string]string, name string) bool {
	_, ok := m[name]
	return ok
}

// When .env sets DATABASE_URL or AMQP_URL, env.sh says where they lead,
// the password masked: docker compose reads the same file, and a make ctl
// that reaches another server than the one meant must not pass unnoticed.
func TestEnvFileSaysWhereTheURLsLead(t *testing.T) {
	t.Parallel()
	said := func(body string) string {
		file := filepath.Join(t.TempDir(), ".env")
		if err := os.WriteFile(file, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command("./env.sh", "true")
		for _, kv := range os.Environ() {
			if name, _, _ := strings.Cut(kv, "="); name != "DATABASE_URL" && name != "AMQP_URL" {
				cmd.Env = append(cmd.Env, kv)
			}
		}
		cmd.Env = append(cmd.Env, "DOTENV="+file)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("env.sh: %v\n%s", err, stderr.String())
		}
		return stderr.String()
	}
	out := said("DATABASE_URL=postgres://postgres:s3cret@127.0.0.1:5432/orders\nAMQP_URL=amqp://guest:guest@127.0.0.1:5672/\n")
	for _, want := range []string{
		"DATABASE_URL=postgres://postgres:***@127.0.0.1:5432/orders (from ",
		"AMQP_URL=amqp://guest:***@127.0.0.1:5672/ (from ",
		"docker compose does not read it",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("env.sh does not say %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "s3cret") {
		t.Errorf("env.sh printed a password:\n%s", out)
	}
	// A cluster's nodes: every password masked.
	out = said("AMQP_URL=amqp://u:s3cret@mq-1:5672/,amqp://u:s3cret@mq-2:5672/\n")
	if want := "AMQP_URL=amqp://u:***@mq-1:5672/,amqp://u:***@mq-2:5672/ (from "; !strings.Contains(out, want) {
		t.Errorf("env.sh does not say %q:\n%s", want, out)
	}
	if strings.Contains(out, "s3cret") {
		t.Errorf("env.sh printed a password of a node:\n%s", out)
	}
	if out := said("LOG_LEVEL=debug\n"); strings.Contains(out, "connect there") {
		t.Errorf("no URL in the file, and env.sh named one:\n%s", out)
	}
}

// .env.example has a section for each of its readers: docker compose's,
// whose settings are all ORDERS_* (the only variables the compose files
// read: deploy/env_test.go), then the host tools', where none is.
func TestEnvExampleSeparatesComposeFromTheHostTools(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../.env.example")
	if err != nil {
		t.Fatal(err)
	}
	const composeHeading, hostHeading = "# ---- docker compose", "# ---- the host tools"
	section := ""
	names := map[string][]string{}
	for line := range strings.Lines(string(raw)) {
		line = strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(line, composeHeading):
			section = "compose"
		case strings.HasPrefix(line, hostHeading):
			section = "host"
		case line == "" || strings.HasPrefix(line, "#"):
		default:
			name, _, _ := strings.Cut(line, "=")
			names[section] = append(names[section], name)
		}
	}
	if len(names[""]) > 0 || len(names["compose"]) == 0 || len(names["host"]) == 0 {
		t.Fatalf("want settings under %q, then under %q, and none before: %v", composeHeading, hostHeading, names)
	}
	for _, name := range names["compose"] {
		if !strings.HasPrefix(name, "ORDERS_") {
			t.Errorf("%s is in docker compose's section, which reads only ORDERS_*", name)
		}
	}
	for _, name := range names["host"] {
		if strings.HasPrefix(name, "ORDERS_") {
			t.Errorf("%s is in the host tools' section: ORDERS_* are docker compose's", name)
		}
	}
}

// make stop stops a running make dev (found by its pid file) and says so
// when there is none; a second make dev refuses to start beside the first.
func TestDevStop(t *testing.T) {
	t.Parallel()
	bin := t.TempDir()
	dev := func(args ...string) (string, error) {
		cmd := exec.Command("./dev.sh", args...)
		cmd.Env = append(os.Environ(), "DEV_BIN="+bin, "DOTENV=none")
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := dev("stop"); err != nil || !strings.Contains(out, "not running") {
		t.Fatalf("stop with nothing running: %v\n%s", err, out)
	}

	// A stand-in for a running make dev: its command line names dev.sh,
	// and it exits on SIGTERM.
	fake := exec.Command("bash", "-c", `trap "exit 0" TERM; while :; do sleep 0.05; done`, "dev.sh")
	if err := fake.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = fake.Wait(); close(exited) }()
	t.Cleanup(func() { _ = fake.Process.Kill(); <-exited })
	if err := os.WriteFile(filepath.Join(bin, "dev.pid"), []byte(strconv.Itoa(fake.Process.Pid)), 0o600); err != nil {
		t.Fatal(err)
	}

	if out, err := dev(); err == nil || !strings.Contains(out, "running already") {
		t.Fatalf("a second make dev: %v\n%s", err, out)
	}
	if out, err := dev("stop"); err != nil || !strings.Contains(out, "stopped") {
		t.Fatalf("stop: %v\n%s", err, out)
	}
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		t.Fatal("make stop returned and the process still runs")
	}
}

// passedOn runs a script (args) with env, and returns the value of the
// variable name it passed on to its command, env.
func passedOn(t *testing.T, name string, env []string, args ...string) string {
	t.Helper()
	cmd := exec.Command(args[0], append(args[1:], "env")...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %v\n%s", args, err, out)
	}
	for line := range strings.Lines(string(out)) {
		if v, ok := strings.CutPrefix(strings.TrimSuffix(line, "\n"), name+"="); ok {
			return v
		}
	}
	t.Fatalf("%v passed on no %s:\n%s", args, name, out)
	return ""
}

// make ctl and make walkthrough connect as their own PostgreSQL role and
// RabbitMQ user: the URLs' users replaced, the rest kept; an empty name
// keeps the URL's own user.
func TestOperatorLogins(t *testing.T) {
	t.Parallel()
	db := "DATABASE_URL=postgres://owner:secret@db.example:6432/orders?sslmode=disable"
	amqpURL := "AMQP_URL=amqp://admin:admin@mq.example:5673/orders"
	for _, c := range []struct {
		name string
		env  []string
		args []string
		want string
	}{
		{"DATABASE_URL", []string{db, "DB_PASSWORD_ORDERS_OPERATOR="}, []string{"./db-role.sh", "orders_operator"},
			"postgres://orders_operator@db.example:6432/orders?sslmode=disable"},
		{"DATABASE_URL", []string{db}, []string{"./db-role.sh", ""},
			"postgres://owner:secret@db.example:6432/orders?sslmode=disable"},
		// The role's own URL is kept whole, its password with it.
		{"DATABASE_URL", []string{"DATABASE_URL=postgres://orders_operator:operator-dev@127.0.0.1:5432/orders", "DB_PASSWORD_ORDERS_OPERATOR="},
			[]string{"./db-role.sh", "orders_operator"}, "postgres://orders_operator:operator-dev@127.0.0.1:5432/orders"},
		// A password for the role.
		{"DATABASE_URL", []string{db, "DB_PASSWORD_ORDERS_OPERATOR=op-s3cret"}, []string{"./db-role.sh", "orders_operator"},
			"postgres://orders_operator:op-s3cret@db.example:6432/orders?sslmode=disable"},
		{"AMQP_URL", []string{amqpURL}, []string{"./amqp-user.sh", "orders-operator"},
			"amqp://orders-operator:orders-operator@mq.example:5673/orders"},
		{"AMQP_URL", []string{amqpURL, "RABBITMQ_PASSWORD_ORDERS_WALKTHROUGH=s3cret"}, []string{"./amqp-user.sh", "orders-walkthrough"},
			"amqp://orders-walkthrough:s3cret@mq.example:5673/orders"},
		{"AMQP_URL", []string{amqpURL}, []string{"./amqp-user.sh", ""},
			"amqp://admin:admin@mq.example:5673/orders"},
		// The nodes of a cluster: the user replaced in each.
		{"AMQP_URL", []string{"AMQP_URL=amqp://admin:admin@mq-1:5672/orders, amqp://admin:admin@mq-2:5672/orders"}, []string{"./amqp-user.sh", "orders-operator"},
			"amqp://orders-operator:orders-operator@mq-1:5672/orders,amqp://orders-operator:orders-operator@mq-2:5672/orders"},
	} {
		if got := passedOn(t, c.name, c.env, c.args...); got != c.want {
			t.Errorf("%v with %v: %s = %q, want %q", c.args, c.env, c.name, got, c.want)
		}
	}
}

// db-role.sh drops the password of another user's URL, since it is not
// the role's, and says so on stderr with what to do; with nothing to drop
// it says nothing.
func TestDBRoleSaysWhenItDropsAPassword(t *testing.T) {
	t.Parallel()
	run := func(env ...string) (stdout, stderr string) {
		cmd := exec.Command("./db-role.sh", "orders_operator", "sh", "-c", `printf %s "$DATABASE_URL"`)
		cmd.Env = append(os.Environ(), append(env, "DB_PASSWORD_ORDERS_OPERATOR=")...)
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		if err := cmd.Run(); err != nil {
			t.Fatalf("db-role.sh: %v\n%s", err, errOut.String())
		}
		return out.String(), errOut.String()
	}
	url, said := run("DATABASE_URL=postgres://postgres:postgres@127.0.0.1:5432/orders")
	if url != "postgres://orders_operator@127.0.0.1:5432/orders" {
		t.Errorf("DATABASE_URL = %q", url)
	}
	for _, want := range []string{"orders_operator without a password", "postgres's, not orders_operator's", "DB_PASSWORD_ORDERS_OPERATOR"} {
		if !strings.Contains(said, want) {
			t.Errorf("stderr lacks %q:\n%s", want, said)
		}
	}
	if _, said := run("DATABASE_URL=postgres://postgres@127.0.0.1:5432/orders"); said != "" {
		t.Errorf("no password to drop, and db-role.sh said:\n%s", said)
	}
}

// The development secret of order-api's tokens is one value: the
// Makefile's (make run, make token), scripts/dev.sh's and .env.example's
// (for make dev), so that a token of make token works against each; it is
// the one the binaries refuse outside development
// (config.DevelopmentJWTSecret), and the compose files, whose stack makes
// a secret of its own, do not have it.
func TestOneDevelopmentJWTSecret(t *testing.T) {
	t.Parallel()
	makefile, err := os.ReadFile("../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(makefile), "\nDEV_JWT_SECRET  := ")
	secret, _, _ := strings.Cut(rest, "\n")
	if !ok || secret != config.DevelopmentJWTSecret {
		t.Fatalf("the Makefile's DEV_JWT_SECRET is %q, want config.DevelopmentJWTSecret", secret)
	}
	for file, want := range map[string]string{
		"dev.sh":          `API_JWT_SECRET="${API_JWT_SECRET:-` + secret + `}"`,
		"../.env.example": "\nAPI_JWT_SECRET=" + secret + "\n",
	} {
		raw, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(raw), want) {
			t.Errorf("%s does not have %s", file, want)
		}
	}
	for _, file := range []string{"../docker-compose.yml", "../docker-compose.demo.yml"} {
		raw, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(raw), secret) {
			t.Errorf("%s has the development secret: the stack makes its own", file)
		}
	}
}
