package config_test

import (
	"strings"
	"testing"
	"time"

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
	if got := strings.Join(config.Variables(&cfg), ","); got != "DATABASE_URL,DB_MAX_CONNS,MIGRATE_ON_START,DB_STATEMENT_TIMEOUT,DB_LOCK_TIMEOUT,DB_CONNECT_TIMEOUT,LOG_LEVEL,LOG_FORMAT,TEST_BATCH,TEST_TIMEOUT,TEST_TOKEN" {
		t.Errorf("Variables = %s", got)
	}
}
