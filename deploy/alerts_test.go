package deploy

import (
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

const alertRules = "prometheus/alerts.yml"

// rulesFile is the part of a Prometheus rules file the tests read.
type rulesFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

// TestAlertRules: Prometheus loads the rules file compose mounts, every
// rule is complete and selects only documented metrics, and the database's
// alerts are there: a horizon held over 5 minutes, and the outbox's dead
// tuples.
func TestAlertRules(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile(alertRules)
	if err != nil {
		t.Fatal(err)
	}
	var rules rulesFile
	if err := yaml.Unmarshal(raw, &rules); err != nil {
		t.Fatalf("%s: %v", alertRules, err)
	}
	docs, prefixes := documentedMetrics(t)
	exprs := map[string]string{}
	for _, g := range rules.Groups {
		if g.Name == "" {
			t.Errorf("%s: a group has no name", alertRules)
		}
		for _, r := range g.Rules {
			if r.Alert == "" || strings.TrimSpace(r.Expr) == "" || r.Annotations["summary"] == "" || r.Labels["severity"] == "" {
				t.Errorf("%s: rule %q: want alert, expr, a severity label and a summary", alertRules, r.Alert)
			}
			if _, dup := exprs[r.Alert]; dup {
				t.Errorf("%s: alert %s is defined twice", alertRules, r.Alert)
			}
			exprs[r.Alert] = r.Expr
			if r.For != "" {
				if _, err := time.ParseDuration(r.For); err != nil {
					t.Errorf("%s: %s: for %q: %v", alertRules, r.Alert, r.For, err)
				}
			}
			names, err := metricNames(r.Expr)
			if err != nil || len(names) == 0 {
				t.Errorf("%s: %s: %q selects no metric (%v)", alertRules, r.Alert, r.Expr, err)
			}
			for _, name := range names {
				if _, err := resolveMetric(name, docs, prefixes); err != nil {
					t.Errorf("%s: %s: %v", alertRules, r.Alert, err)
				}
			}
		}
	}
	for alert, want := range map[string]string{
		"TransactionHorizonHeld": `^max by \(kind\) \(db_xmin_horizon_age_seconds\) > 300$`,
		"OutboxDeadTuplesHigh":   `db_table_dead_tuples\{table="message_outbox"\}\) > \d+$`,
	} {
		if !regexp.MustCompile(want).MatchString(strings.TrimSpace(exprs[alert])) {
			t.Errorf("%s: alert %s is %q, want it to match %s", alertRules, alert, exprs[alert], want)
		}
	}

	config, err := os.ReadFile(prometheusConfig)
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^rule_files:\s*\n\s+-\s*/etc/prometheus/alerts\.yml\s*$`).Match(config) {
		t.Errorf("%s: does not load /etc/prometheus/alerts.yml (rule_files)", prometheusConfig)
	}
	if !strings.Contains(readRepoFile(t, "docker-compose.yml"), "./deploy/prometheus/alerts.yml:/etc/prometheus/alerts.yml:ro") {
		t.Errorf("docker-compose.yml does not mount %s where prometheus.yml loads it", alertRules)
	}
}
