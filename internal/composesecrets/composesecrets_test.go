package composesecrets_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/yourorg/orders/internal/composesecrets"
	"github.com/yourorg/orders/internal/config"
	"github.com/yourorg/orders/internal/rabbitadmin"
	"github.com/yourorg/orders/internal/testenv"
)

// definitions are the repository's definitions files: the stack's, and
// the demo's besides.
func definitions(t *testing.T, demo bool) []string {
	t.Helper()
	root := testenv.RepoRoot(t)
	files := []string{filepath.Join(root, rabbitadmin.DefinitionsFile)}
	if demo {
		files = append(files, filepath.Join(root, rabbitadmin.DemoDefinitionsFile))
	}
	return files
}

func read(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, s := range composesecrets.Secrets {
		raw, err := os.ReadFile(filepath.Join(dir, s.File))
		if err != nil {
			t.Fatal(err)
		}
		out[s.File] = string(raw)
	}
	return out
}

// rendered reads the rendered definitions, and checks that each user's
// hash is of its secret.
func rendered(t *testing.T, dir string) []string {
	t.Helper()
	d, err := rabbitadmin.ReadDefinitions(filepath.Join(dir, composesecrets.RabbitMQDefinitions))
	if err != nil {
		t.Fatal(err)
	}
	secrets := read(t, dir)
	var users []string
	for _, u := range d.Users {
		users = append(users, u.Name)
		ok, err := rabbitadmin.CheckPassword(u.PasswordHash, secrets[composesecrets.RabbitMQUserFile(u.Name)])
		if !ok || err != nil || u.HashingAlgorithm != rabbitadmin.HashingAlgorithm {
			t.Errorf("user %s: the hash is not of its secret (%v, %s)", u.Name, err, u.HashingAlgorithm)
		}
		if _, ok := d.PermissionsOf(u.Name, "/"); !ok {
			t.Errorf("user %s lost its permissions", u.Name)
		}
	}
	slices.Sort(users)
	return users
}

// A first start generates every secret: long, each its own, none a
// credential the repository publishes, readable by the services' users;
// the broker's definitions carry the hashes of the users' passwords. The
// next start keeps them.
func TestFirstStartGeneratesThenKeeps(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "secrets")
	none := func(string) string { return "" }
	if _, err := composesecrets.Ensure(dir, none, definitions(t, false)...); err != nil {
		t.Fatal(err)
	}
	first := read(t, dir)
	seen := map[string]bool{}
	for file, secret := range first {
		if len(secret) < 32 || seen[secret] || config.DevelopmentCredential(secret) {
			t.Errorf("%s: %d characters, seen before %v: want 32 or more, its own", file, len(secret), seen[secret])
		}
		seen[secret] = true
		if info, err := os.Stat(filepath.Join(dir, file)); err != nil || info.Mode().Perm() != 0o644 {
			t.Errorf("%s: %v %v, want mode 0644", file, info.Mode(), err)
		}
	}
	if got, want := rendered(t, dir), []string{"orders-admin", "orders-consumer", "orders-operator", "orders-relay"}; !slices.Equal(got, want) {
		t.Errorf("the broker's users %v, want %v (no walkthrough outside the demo)", got, want)
	}
	report, err := composesecrets.Ensure(dir, none, definitions(t, false)...)
	if err != nil {
		t.Fatal(err)
	}
	if again := read(t, dir); !mapsEqual(again, first) {
		t.Error("a second start changed the secrets")
	}
	for _, line := range report {
		for _, secret := range first {
			if strings.Contains(line, secret) {
				t.Errorf("the report shows a secret: %s", line)
			}
		}
	}
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// A secret set in .env is taken, at every start (a change replaces the
// file, and says what it does not change by itself); a credential the
// repository publishes is refused, naming the variable.
func TestSecretsFromTheEnvironment(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	env := map[string]string{"ORDERS_DB_API_PASSWORD": "one-of-our-own", "ORDERS_RABBITMQ_RELAY_PASSWORD": "the-relays-own"}
	getenv := func(k string) string { return env[k] }
	if _, err := composesecrets.Ensure(dir, getenv, definitions(t, false)...); err != nil {
		t.Fatal(err)
	}
	got := read(t, dir)
	if got["db-orders_api"] != "one-of-our-own" || got["rabbitmq-orders-relay"] != "the-relays-own" {
		t.Errorf("db-orders_api %q, rabbitmq-orders-relay %q: not the environment's", got["db-orders_api"], got["rabbitmq-orders-relay"])
	}
	rendered(t, dir) // the relay's hash is of the environment's password
	env["ORDERS_DB_API_PASSWORD"] = "another-of-our-own"
	report, err := composesecrets.Ensure(dir, getenv, definitions(t, false)...)
	if err != nil {
		t.Fatal(err)
	}
	if read(t, dir)["db-orders_api"] != "another-of-our-own" || !slices.ContainsFunc(report, func(l string) bool {
		return strings.Contains(l, "db-orders_api: replaced from ORDERS_DB_API_PASSWORD") && strings.Contains(l, "ALTER ROLE")
	}) {
		t.Errorf("a changed ORDERS_DB_API_PASSWORD: report %q", report)
	}
	for variable, dev := range map[string]string{
		"ORDERS_API_JWT_SECRET":          config.DevelopmentJWTSecret,
		"ORDERS_DB_API_PASSWORD":         "api-dev",
		"ORDERS_RABBITMQ_ADMIN_PASSWORD": rabbitadmin.DevPassword(rabbitadmin.AdminUser),
	} {
		_, err := composesecrets.Ensure(t.TempDir(), func(k string) string {
			if k == variable {
				return dev
			}
			return ""
		}, definitions(t, false)...)
		if err == nil || !strings.Contains(err.Error(), variable+" is a development credential") {
			t.Errorf("%s=%s: err = %v, want it refused", variable, dev, err)
		}
	}
}

// The demo's walkthrough user, which may publish to orders.events, is in
// the broker's definitions only while the demo's definitions are given:
// the next start of the stack alone renders it out again.
func TestWalkthroughUserOnlyInTheDemo(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	none := func(string) string { return "" }
	if _, err := composesecrets.Ensure(dir, none, definitions(t, true)...); err != nil {
		t.Fatal(err)
	}
	if users := rendered(t, dir); !slices.Contains(users, rabbitadmin.WalkthroughUser) {
		t.Errorf("the demo's users %v: no %s", users, rabbitadmin.WalkthroughUser)
	}
	if _, err := composesecrets.Ensure(dir, none, definitions(t, false)...); err != nil {
		t.Fatal(err)
	}
	if users := rendered(t, dir); slices.Contains(users, rabbitadmin.WalkthroughUser) {
		t.Errorf("the stack's users %v after the demo: %s is still there", users, rabbitadmin.WalkthroughUser)
	}
	if secret, err := composesecrets.Show(dir, composesecrets.RabbitMQUserFile(rabbitadmin.AdminUser)); err != nil || len(secret) < 32 {
		t.Errorf("Show the administrator's password: %d characters, %v", len(secret), err)
	}
	if _, err := composesecrets.Show(dir, "../etc/passwd"); err == nil {
		t.Error("Show of a file that is no secret: no error")
	}
}
