package config_test

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/caarlos0/env/v11"

	"github.com/yourorg/orders/internal/config"
)

type testConfig struct {
	config.Database
	config.Log
	Batch   int           `env:"TEST_BATCH" envDefault:"100"`
	Timeout time.Duration `env:"TEST_TIMEOUT" envDefault:"5s"`
	Token   string        `env:"TEST_TOKEN" secret:"true"`
}

func (c *testConfig) Validate() error {
	return joinErrs(c.Database.Validate(), c.Log.Validate(), config.Positive("TEST_BATCH", c.Batch))
}

func joinErrs(errs ...error) error {
	var msgs []string
	for _, e := range errs {
		if e != nil {
			msgs = append(msgs, e.Error())
		}
	}
	if len(msgs) == 0 {
		return nil
	}
	return &multi{strings.Join(msgs, "\n")}
}

type multi struct{ s string }

func (m *multi) Error() string { return m.s }

func TestLoadDefaults(t *testing.T) {
	t.Parallel()
	var cfg testConfig
	if err := config.Load(&cfg, map[string]string{}); err != nil {
		t.Fatal(err)
	}
	if cfg.Batch != 100 || cfg.Timeout != 5*time.Second || cfg.Level != "info" || cfg.Format != "json" ||
		cfg.MaxConns != 10 || cfg.ConnectTimeout != 30*time.Second || !strings.HasPrefix(cfg.URL, "postgres://") {
		t.Fatalf("defaults: %+v", cfg)
	}
}

func TestLoadRejectsBadValuesNamingTheVariable(t *testing.T) {
	t.Parallel()
	cases := map[string]map[string]string{
		"TEST_BATCH":         {"TEST_BATCH": "0"},
		"TEST_TIMEOUT":       {"TEST_TIMEOUT": "soon"},
		"LOG_LEVEL":          {"LOG_LEVEL": "loud"},
		"LOG_FORMAT":         {"LOG_FORMAT": "xml"},
		"DB_MAX_CONNS":       {"DB_MAX_CONNS": "-1"},
		"DB_CONNECT_TIMEOUT": {"DB_CONNECT_TIMEOUT": "0s"},
	}
	for variable, environ := range cases {
		var cfg testConfig
		err := config.Load(&cfg, environ)
		if err == nil || !strings.Contains(err.Error(), variable) {
			t.Errorf("%v: err = %v, want it to name %s", environ, err, variable)
		}
	}
}

func TestDescribeMasksSecrets(t *testing.T) {
	t.Parallel()
	var cfg testConfig
	err := config.Load(&cfg, map[string]string{
		"DATABASE_URL": "postgres://app:hunter2@db:5432/orders",
		"TEST_TOKEN":   "s3cret",
	})
	if err != nil {
		t.Fatal(err)
	}
	described := map[string]string{}
	for _, s := range config.Describe(&cfg) {
		described[s.Name] = s.Value
	}
	if strings.Contains(described["DATABASE_URL"], "hunter2") || !strings.Contains(described["DATABASE_URL"], "app:") {
		t.Errorf("DATABASE_URL described as %q", described["DATABASE_URL"])
	}
	if described["TEST_TOKEN"] != "*****" {
		t.Errorf("TEST_TOKEN described as %q", described["TEST_TOKEN"])
	}
	if got := strings.Join(config.Variables(&cfg), ","); got != "DATABASE_URL,DATABASE_PASSWORD_FILE,DB_MAX_CONNS,MIGRATE_ON_START,MIGRATE_RELAY_WAL_ROLE,DB_STATEMENT_TIMEOUT,DB_LOCK_TIMEOUT,DB_CONNECT_TIMEOUT,LOG_LEVEL,LOG_FORMAT,TEST_BATCH,TEST_TIMEOUT,TEST_TOKEN" {
		t.Errorf("Variables = %s", got)
	}
}

// A URL that is a credential as a whole (a webhook's: a token in its path,
// a signature in its query) is described by its scheme and host only.
func TestDescribeURLThatIsASecret(t *testing.T) {
	t.Parallel()
	var cfg struct {
		Hook string `env:"TEST_HOOK" secret:"url"`
		None string `env:"TEST_NONE" secret:"url"`
	}
	cfg.Hook = "https://bot:pw@hooks.example.com:8443/services/T0K3N/B4D?token=S1G#frag"
	described := config.Describe(&cfg)
	if got := described[0].Value; got != "https://hooks.example.com:8443/…" {
		t.Errorf("TEST_HOOK described as %q", got)
	}
	if got := described[1].Value; got != "" {
		t.Errorf("an empty TEST_NONE described as %q", got)
	}
	for raw, want := range map[string]string{"not a url": "*****", "hooks.example.com/T0K3N": "*****", "http://h/": "http://h/…"} {
		if got := config.URLOrigin(raw); got != want {
			t.Errorf("URLOrigin(%q) = %q, want %q", raw, got, want)
		}
	}
}

// Redact masks every form of credential a setting may carry, and leaves
// the rest of the value readable.
func TestRedact(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, in, want string
	}{
		{"URL password", "postgres://app:hunter2@db:5432/orders?sslmode=disable",
			"postgres://app:*****@db:5432/orders?sslmode=disable"},
		{"URL user without password", "postgres://postgres@127.0.0.1:5432/orders?sslmode=disable",
			"postgres://postgres@127.0.0.1:5432/orders?sslmode=disable"},
		{"URL password parameter", "postgres://app@db/orders?sslmode=require&password=hunter2",
			"postgres://app@db/orders?sslmode=require&password=*****"},
		{"URL sslpassword and escaped name", "postgres://db/orders?ssl%70assword=hunter2&application_name=x",
			"postgres://db/orders?ssl%70assword=*****&application_name=x"},
		{"AMQP URL", "amqp://guest:hunter2@rabbit:5672/vhost", "amqp://guest:*****@rabbit:5672/vhost"},
		{"AMQP URLs of a cluster", "amqp://relay:hunter2@rabbitmq-1:5672/,amqp://relay:hunter2@rabbitmq-2:5672/, amqps://relay:hunter2@rabbitmq-3:5671/",
			"amqp://relay:*****@rabbitmq-1:5672/,amqp://relay:*****@rabbitmq-2:5672/, amqps://relay:*****@rabbitmq-3:5671/"},
		{"PostgreSQL URL of several hosts", "postgres://app:hunter2@db1:5432,db2:5432/orders", "postgres://app:*****@db1:5432,db2:5432/orders"},
		{"webhook token parameter", "https://hooks.example.com/notify?token=hunter2&team=ops",
			"https://hooks.example.com/notify?token=*****&team=ops"},
		{"webhook key, secret, signature", "https://h.example.com/n?api_key=h1&client_secret=h2&X-Amz-Signature=h3&sig=h4&code=h5&page=2",
			"https://h.example.com/n?api_key=*****&client_secret=*****&X-Amz-Signature=*****&sig=*****&code=*****&page=2"},
		{"webhook userinfo", "https://user:hunter2@hooks.example.com/notify", "https://*****@hooks.example.com/notify"},
		{"webhook user as token", "https://hunter2@hooks.example.com/notify", "https://*****@hooks.example.com/notify"},
		{"webhook fragment", "https://hooks.example.com/notify#access_token=hunter2", "https://hooks.example.com/notify#*****"},
		{"keyword/value", "host=db user=app password=hunter2 dbname=orders",
			"host=db user=app password=***** dbname=orders"},
		{"keyword/value, spaces and quotes", "host=db password = 'hun ter\\'2' dbname=orders sslpassword=hunter2",
			"host=db password = ***** dbname=orders sslpassword=*****"},
		{"keyword/value, password last", "dbname=orders password=hunter2", "dbname=orders password=*****"},
		{"not a URL", "fulfillment,warehouse,notification", "fulfillment,warehouse,notification"},
		{"duration", "30s", "30s"},
		{"address", ":8080", ":8080"},
		{"endpoint", "http://jaeger:4318", "http://jaeger:4318"},
		{"empty", "", ""},
	}
	for _, c := range cases {
		got := config.Redact(c.in)
		if got != c.want {
			t.Errorf("%s: Redact(%q) = %q, want %q", c.name, c.in, got, c.want)
		}
		if strings.Contains(got, "hunter2") || strings.Contains(got, "hun ter") {
			t.Errorf("%s: Redact(%q) = %q shows the secret", c.name, c.in, got)
		}
	}
}

// LogAttrs, the start-up line, masks each form of credential in whatever
// setting carries it.
func TestLogAttrsMasksEveryForm(t *testing.T) {
	t.Parallel()
	type webhookConfig struct {
		config.Database
		Webhook string `env:"TEST_WEBHOOK_URL"`
	}
	for _, environ := range []map[string]string{
		{"DATABASE_URL": "postgres://app:hunter2@db:5432/orders"},
		{"DATABASE_URL": "postgres://app@db:5432/orders?password=hunter2"},
		{"DATABASE_URL": "host=db user=app password=hunter2 dbname=orders"},
		{"TEST_WEBHOOK_URL": "https://hooks.example.com/n?token=hunter2"},
		{"TEST_WEBHOOK_URL": "https://hooks.example.com/n?key=hunter2"},
		{"TEST_WEBHOOK_URL": "https://hooks.example.com/n?secret=hunter2"},
		{"TEST_WEBHOOK_URL": "https://hooks.example.com/n?signature=hunter2"},
		{"TEST_WEBHOOK_URL": "https://hunter2@hooks.example.com/n"},
		{"TEST_WEBHOOK_URL": "https://u:hunter2@hooks.example.com/n"},
	} {
		var cfg webhookConfig
		if err := env.ParseWithOptions(&cfg, env.Options{Environment: environ}); err != nil {
			t.Fatal(err)
		}
		var line bytes.Buffer
		slog.New(slog.NewJSONHandler(&line, nil)).Info("starting", config.LogAttrs(&cfg)...)
		if strings.Contains(line.String(), "hunter2") || !strings.Contains(line.String(), "*****") {
			t.Errorf("%v: logged as %s", environ, line.String())
		}
	}
}
