package config_test

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/yourorg/orders/internal/config"
)

// serviceConfig is a process's config: the environment, a database, a
// broker URL and a token secret, the last two readable from files.
type serviceConfig struct {
	config.Environment
	config.Database
	AMQPURL string `env:"AMQP_URL" envDefault:"amqp://guest:guest@127.0.0.1:5672/" passwordFile:"AMQP_PASSWORD_FILE"`
	Secret  string `env:"TEST_SECRET" secret:"true" fromFile:"TEST_SECRET_FILE"`
}

func (c *serviceConfig) Validate() error {
	return c.Database.Validate() // Load checks the Environment block itself
}

// namedConfig has a setting that is no secret.
type namedConfig struct {
	config.Environment
	Name string `env:"TEST_NAME"`
}

func (c *namedConfig) Validate() error { return nil }

func secretFile(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// Outside development (the default), a process refuses every credential
// this repository publishes, in every form it takes, naming the variable;
// in development (DEV_MODE=true) it starts with them.
func TestDevelopmentCredentialsAreRefusedOutsideDevelopment(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		environ map[string]string
		want    string
	}{
		"the development JWT secret":         {map[string]string{"TEST_SECRET": config.DevelopmentJWTSecret}, "TEST_SECRET is a development credential"},
		"the JWT secret from a file":         {map[string]string{"TEST_SECRET_FILE": secretFile(t, config.DevelopmentJWTSecret+"\n")}, "TEST_SECRET is a development credential"},
		"a compose role's password":          {map[string]string{"DATABASE_URL": "postgres://orders_api:api-dev@db:5432/orders"}, "DATABASE_URL carries a development password"},
		"the superuser's password":           {map[string]string{"DATABASE_URL": "postgres://postgres:postgres@db/orders"}, "DATABASE_URL carries a development password"},
		"a keyword/value connection string":  {map[string]string{"DATABASE_URL": "host=db user=orders_relay password='relay-dev' dbname=orders"}, "DATABASE_URL carries a development password"},
		"a RabbitMQ user's password":         {map[string]string{"AMQP_URL": "amqp://orders-relay:orders-relay@mq:5672/"}, "AMQP_URL carries a development password"},
		"the administrator's password":       {map[string]string{"AMQP_URL": "amqp://orders-admin:orders-admin@mq:5672/"}, "AMQP_URL carries a development password"},
		"a RabbitMQ password from a file":    {map[string]string{"AMQP_URL": "amqp://orders-walkthrough@mq/", "AMQP_PASSWORD_FILE": secretFile(t, "orders-walkthrough")}, "AMQP_URL carries a development password"},
		"a database password from a file":    {map[string]string{"DATABASE_URL": "postgres://orders_api@db/orders", "DATABASE_PASSWORD_FILE": secretFile(t, "api-dev\n")}, "DATABASE_URL carries a development password"},
		"development said no to":             {map[string]string{"DEV_MODE": "false", "TEST_SECRET": config.DevelopmentJWTSecret}, "TEST_SECRET is a development credential"},
		"a development mode that is no bool": {map[string]string{"DEV_MODE": "development"}, "DEV_MODE"},
	} {
		var cfg serviceConfig
		err := config.Load(&cfg, tc.environ)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want %q", name, err, tc.want)
		}
		if tc.environ["DEV_MODE"] == "development" {
			continue
		}
		tc.environ["DEV_MODE"] = "true"
		if err := config.Load(&cfg, tc.environ); err != nil {
			t.Errorf("%s in development: %v", name, err)
		}
	}
	// Secrets of one's own pass, and so does RabbitMQ's guest (the broker
	// lets it in from its own machine only), and a setting that is no
	// secret but is spelt like a password of make dev's (a user's name).
	var cfg serviceConfig
	if err := config.Load(&cfg, map[string]string{"DATABASE_URL": "postgres://orders_api:Zk3-own@db/orders", "TEST_SECRET": "an-own-secret-of-32-bytes-or-more-!"}); err != nil {
		t.Errorf("own secrets: %v", err)
	}
	var named namedConfig
	if err := config.Load(&named, map[string]string{"TEST_NAME": "orders-relay"}); err != nil {
		t.Errorf("a name spelt like a development password: %v", err)
	}
}

// A secret may come from a file (docker compose's generated secrets, a
// Docker or Kubernetes secret): the whole value, or the password of a URL.
// Each mistake names its variables.
func TestSecretsFromFiles(t *testing.T) {
	t.Parallel()
	var cfg serviceConfig
	err := config.Load(&cfg, map[string]string{
		"DATABASE_URL": "postgres://orders_api@db:5432/orders?sslmode=disable", "DATABASE_PASSWORD_FILE": secretFile(t, "p@ss/w:rd\n"),
		"AMQP_URL": "amqp://orders-relay@mq:5672/", "AMQP_PASSWORD_FILE": secretFile(t, "mq-secret"),
		"TEST_SECRET_FILE": secretFile(t, "token-secret\r\n"),
	})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.URL != "postgres://orders_api:p%40ss%2Fw%3Ard@db:5432/orders?sslmode=disable" || cfg.AMQPURL != "amqp://orders-relay:mq-secret@mq:5672/" || cfg.Secret != "token-secret" {
		t.Errorf("DATABASE_URL %q, AMQP_URL %q, TEST_SECRET %q", cfg.URL, cfg.AMQPURL, cfg.Secret)
	}
	// The nodes of a cluster: the password in each URL.
	cfg = serviceConfig{}
	if err := config.Load(&cfg, map[string]string{
		"AMQP_URL": "amqp://orders-relay@mq-1:5672/, amqp://orders-relay@mq-2:5672/", "AMQP_PASSWORD_FILE": secretFile(t, "mq-secret"),
	}); err != nil {
		t.Fatal(err)
	}
	if want := "amqp://orders-relay:mq-secret@mq-1:5672/,amqp://orders-relay:mq-secret@mq-2:5672/"; cfg.AMQPURL != want {
		t.Errorf("AMQP_URL of two nodes %q, want %q", cfg.AMQPURL, want)
	}
	for name, tc := range map[string]struct {
		environ map[string]string
		want    string
	}{
		"a missing file":          {map[string]string{"TEST_SECRET_FILE": filepath.Join(t.TempDir(), "none")}, "TEST_SECRET_FILE: open"},
		"an empty file":           {map[string]string{"TEST_SECRET_FILE": secretFile(t, "\n")}, "TEST_SECRET_FILE: " + "/"},
		"both":                    {map[string]string{"TEST_SECRET": "x", "TEST_SECRET_FILE": secretFile(t, "y")}, "TEST_SECRET and TEST_SECRET_FILE are both set"},
		"a URL with a password":   {map[string]string{"AMQP_URL": "amqp://u:p@mq/", "AMQP_PASSWORD_FILE": secretFile(t, "q")}, "AMQP_URL, AMQP_PASSWORD_FILE: the URL has a password already"},
		"a URL without a user":    {map[string]string{"DATABASE_URL": "postgres://db/orders", "DATABASE_PASSWORD_FILE": secretFile(t, "q")}, "DATABASE_URL, DATABASE_PASSWORD_FILE: the URL names no user"},
		"a keyword/value string":  {map[string]string{"DATABASE_URL": "host=db user=u", "DATABASE_PASSWORD_FILE": secretFile(t, "q")}, "needs the URL form"},
		"a missing password file": {map[string]string{"AMQP_URL": "amqp://u@mq/", "AMQP_PASSWORD_FILE": filepath.Join(t.TempDir(), "none")}, "AMQP_PASSWORD_FILE: the password file: open"},
		"a node's URL with a password": {map[string]string{"AMQP_URL": "amqp://u@mq-1/,amqp://u:p@mq-2/", "AMQP_PASSWORD_FILE": secretFile(t, "q")},
			"AMQP_URL, AMQP_PASSWORD_FILE: URL 2 of 2: the URL has a password already"},
	} {
		var cfg serviceConfig
		if err := config.Load(&cfg, tc.environ); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want %q", name, err, tc.want)
		}
	}
	got := strings.Join(config.Variables(&serviceConfig{}), ",")
	for _, want := range []string{"DEV_MODE", "DATABASE_PASSWORD_FILE", "AMQP_PASSWORD_FILE", "TEST_SECRET_FILE"} {
		if !strings.Contains(got, want) {
			t.Errorf("Variables %s: no %s", got, want)
		}
	}
	for _, s := range config.Describe(&cfg) {
		if strings.Contains(s.Value, "mq-secret") || strings.Contains(s.Value, "token-secret") {
			t.Errorf("%s described as %q", s.Name, s.Value)
		}
	}
}

// Development is said out loud: one WARN line at start, and none outside it.
func TestWarnDevelopment(t *testing.T) {
	t.Parallel()
	for _, dev := range []bool{true, false} {
		var logs bytes.Buffer
		config.WarnDevelopment(context.Background(), slog.New(slog.NewJSONHandler(&logs, nil)), &serviceConfig{Environment: config.Environment{DevMode: dev}})
		if got := strings.Contains(logs.String(), `"level":"WARN"`) && strings.Contains(logs.String(), "DEV_MODE=true"); got != dev {
			t.Errorf("DEV_MODE=%v: warned %v: %s", dev, got, logs.String())
		}
	}
}
