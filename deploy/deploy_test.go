// Package deploy holds the configuration of the local monitoring stack
// (Prometheus, Grafana) that docker compose runs next to the service. Its
// tests keep the local stack honest without a Docker engine: the
// dashboards query only the metrics docs/observability.md documents, every
// panel is complete, Prometheus scrapes every process (this file) and loads
// complete alert rules on documented metrics (alerts_test.go);
// the compose files name their images by version, health-gate their
// dependencies, build the image once, publish only settable ports and no
// admin port, keep the fault endpoint in the demo and run the whole stack
// (compose_test.go); the Dockerfile builds every command static and runs
// it distroless and non-root (dockerfile_test.go).
package deploy

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

const (
	observabilityDoc = "../docs/observability.md"
	dashboardsDir    = "grafana/dashboards"
	prometheusConfig = "prometheus/prometheus.yml"
	datasourceConfig = "grafana/provisioning/datasources/prometheus.yml"
	dashboardConfig  = "grafana/provisioning/dashboards/dashboards.yml"

	// datasourceUID is the uid the datasource provisioning gives Prometheus;
	// every panel must query it.
	datasourceUID = "prometheus"
)

// dashboard is the part of a Grafana dashboard JSON model the tests read.
type dashboard struct {
	UID    string  `json:"uid"`
	Title  string  `json:"title"`
	Panels []panel `json:"panels"`
}

type panel struct {
	ID         int             `json:"id"`
	Type       string          `json:"type"`
	Title      string          `json:"title"`
	Datasource json.RawMessage `json:"datasource"`
	GridPos    *gridPos        `json:"gridPos"`
	Targets    []target        `json:"targets"`
	Panels     []panel         `json:"panels"` // a collapsed row's panels
}

type gridPos struct {
	H, W, X, Y int
}

type target struct {
	RefID      string          `json:"refId"`
	Expr       string          `json:"expr"`
	Datasource json.RawMessage `json:"datasource"`
}

// namedPanel is a panel with the path that names it in failure messages.
type namedPanel struct {
	panel
	where string // file, row and title
}

// loadDashboards reads every dashboard in grafana/dashboards and returns
// their panels, those nested in collapsed rows included, in order.
func loadDashboards(t *testing.T) (map[string]dashboard, []namedPanel) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dashboardsDir, "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(files, filepath.Join(dashboardsDir, "orders.json")) {
		t.Fatalf("%s/orders.json is missing (found %v)", dashboardsDir, files)
	}
	dashboards := map[string]dashboard{}
	var all []namedPanel
	for _, file := range files {
		raw, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		var d dashboard
		if err := json.Unmarshal(raw, &d); err != nil {
			t.Fatalf("%s: not a dashboard JSON model: %v", file, err)
		}
		dashboards[filepath.Base(file)] = d
		row := ""
		var walk func(ps []panel)
		walk = func(ps []panel) {
			for _, p := range ps {
				if p.Type == "row" {
					row = p.Title
				}
				where := fmt.Sprintf("%s: panel %d %q", filepath.Base(file), p.ID, p.Title)
				if row != "" && p.Type != "row" {
					where = fmt.Sprintf("%s: row %q, panel %d %q", filepath.Base(file), row, p.ID, p.Title)
				}
				all = append(all, namedPanel{panel: p, where: where})
				walk(p.Panels)
			}
		}
		walk(d.Panels)
	}
	return dashboards, all
}

// documentedMetric is one metric of docs/observability.md's tables.
type documentedMetric struct {
	typ string // counter, gauge, histogram
}

var backticked = regexp.MustCompile("`([^`]+)`")

// documentedMetrics reads the metric tables of docs/observability.md: the
// names in backticks in the first column of every table whose first
// header is "metric" (a cell may list several, separated by commas), with
// the type of the second column. It also returns the prefixes the document
// gives as wildcards anywhere in backticks (`go_*`, `process_*`).
func documentedMetrics(t *testing.T) (map[string]documentedMetric, []string) {
	t.Helper()
	raw, err := os.ReadFile(observabilityDoc)
	if err != nil {
		t.Fatal(err)
	}
	metrics := map[string]documentedMetric{}
	var prefixes []string
	inMetricTable := false
	for line := range strings.Lines(string(raw)) {
		line = strings.TrimSpace(line)
		for _, m := range backticked.FindAllStringSubmatch(line, -1) {
			if p, ok := strings.CutSuffix(m[1], "*"); ok && metricName.MatchString(p) {
				prefixes = append(prefixes, p)
			}
		}
		if !strings.HasPrefix(line, "|") {
			inMetricTable = false
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		first := strings.TrimSpace(cells[0])
		switch {
		case first == "metric":
			inMetricTable = true
			continue
		case !inMetricTable || strings.Trim(first, "-: ") == "":
			continue
		}
		typ := ""
		if len(cells) > 1 {
			typ = strings.TrimSpace(cells[1])
		}
		for _, m := range backticked.FindAllStringSubmatch(first, -1) {
			if metricName.MatchString(m[1]) {
				metrics[m[1]] = documentedMetric{typ: typ}
			}
		}
	}
	return metrics, prefixes
}

var metricName = regexp.MustCompile(`^[a-zA-Z_:][a-zA-Z0-9_:]*$`)

// resolveMetric maps a series name used in a query to the documented metric
// it comes from: a histogram's _bucket, _sum and _count series to the
// histogram. It says why the name is not acceptable when it is not.
func resolveMetric(name string, docs map[string]documentedMetric, prefixes []string) (string, error) {
	for _, p := range prefixes {
		if strings.HasPrefix(name, p) {
			return name, nil
		}
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(name, suffix)
		if !ok {
			continue
		}
		if d, ok := docs[base]; ok {
			if d.typ != "histogram" {
				return "", fmt.Errorf("%s: %s is a %s, not a histogram, and has no %s series", name, base, d.typ, suffix)
			}
			return base, nil
		}
	}
	d, ok := docs[name]
	switch {
	case !ok:
		return "", fmt.Errorf("%s is not documented in %s", name, observabilityDoc)
	case d.typ == "histogram":
		return "", fmt.Errorf("%s is a histogram: Prometheus has only its _bucket, _sum and _count series", name)
	}
	return name, nil
}

// promqlKeywords are the identifiers of PromQL that are not metric names
// even when they are not followed by "(" (functions always are): binary
// operators and modifiers, and the aggregations, which may be followed by
// their by or without clause (`sum by (le) (...)`).
var promqlKeywords = map[string]bool{
	// Binary operators and modifiers.
	"and": true, "or": true, "unless": true, "atan2": true, "bool": true,
	"offset": true, "by": true, "without": true, "on": true, "ignoring": true,
	"group_left": true, "group_right": true, "inf": true, "nan": true,

	// Aggregations.
	"sum": true, "min": true, "max": true, "avg": true, "group": true,
	"stddev": true, "stdvar": true, "count": true, "count_values": true,
	"bottomk": true, "topk": true, "quantile": true, "limitk": true,
	"limit_ratio": true,
}

// labelListClauses are followed by a list of label names in parentheses.
var labelListClauses = map[string]bool{
	"by": true, "without": true, "on": true, "ignoring": true,
	"group_left": true, "group_right": true,
}

var nameMatcher = regexp.MustCompile(`__name__\s*(=~|!=|!~|=)\s*"([^"]*)"`)

// metricNames returns the metric names a PromQL expression selects: the
// identifiers left once strings, label matchers ({...}), ranges ([...]),
// numbers and durations, Grafana variables, label lists (by (...),
// on (...), ...), functions (an identifier followed by "(") and keywords
// are taken out, plus any __name__="..." matcher.
func metricNames(expr string) ([]string, error) {
	var names []string
	i := 0
	n := len(expr)
	isIdentStart := func(c byte) bool { return c == '_' || c == ':' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }
	isIdent := func(c byte) bool { return isIdentStart(c) || c >= '0' && c <= '9' }
	skipString := func() error { // expr[i] is the opening quote
		q := expr[i]
		for i++; i < n; i++ {
			switch {
			case expr[i] == '\\' && q != '`':
				i++
			case expr[i] == q:
				i++
				return nil
			}
		}
		return fmt.Errorf("unterminated string in %q", expr)
	}
	skipGroup := func(open, close byte) (string, error) { // expr[i] is open
		start := i
		for depth := 0; i < n; {
			switch c := expr[i]; c {
			case '"', '\'', '`':
				if err := skipString(); err != nil {
					return "", err
				}
				continue
			case open:
				depth++
			case close:
				depth--
				if depth == 0 {
					i++
					return expr[start:i], nil
				}
			}
			i++
		}
		return "", fmt.Errorf("unbalanced %c%c in %q", open, close, expr)
	}
	for i < n {
		c := expr[i]
		switch {
		case c == '"' || c == '\'' || c == '`':
			if err := skipString(); err != nil {
				return nil, err
			}
		case c == '#': // a comment, to the end of the line
			for i < n && expr[i] != '\n' {
				i++
			}
		case c == '{':
			group, err := skipGroup('{', '}')
			if err != nil {
				return nil, err
			}
			for _, m := range nameMatcher.FindAllStringSubmatch(group, -1) {
				if m[1] != "=" {
					return nil, fmt.Errorf("__name__%s%q selects metrics by pattern: name them instead, so they can be checked", m[1], m[2])
				}
				names = append(names, m[2])
			}
		case c == '[':
			if _, err := skipGroup('[', ']'); err != nil {
				return nil, err
			}
		case c == '$': // a Grafana variable: $name or ${name}
			i++
			if i < n && expr[i] == '{' {
				if _, err := skipGroup('{', '}'); err != nil {
					return nil, err
				}
				continue
			}
			for i < n && isIdent(expr[i]) {
				i++
			}
		case c >= '0' && c <= '9' || c == '.': // a number or a duration: 0.99, 1e3, 5m
			for i < n && (isIdent(expr[i]) || expr[i] == '.') {
				i++
			}
		case isIdentStart(c):
			start := i
			for i < n && isIdent(expr[i]) {
				i++
			}
			ident := expr[start:i]
			j := i
			for j < n && (expr[j] == ' ' || expr[j] == '\t' || expr[j] == '\n' || expr[j] == '\r') {
				j++
			}
			followedByParen := j < n && expr[j] == '('
			switch {
			case followedByParen && labelListClauses[strings.ToLower(ident)]:
				i = j
				if _, err := skipGroup('(', ')'); err != nil {
					return nil, err
				}
			case followedByParen: // a function or an aggregation
			case promqlKeywords[strings.ToLower(ident)]:
			default:
				names = append(names, ident)
			}
		default:
			i++
		}
	}
	return names, nil
}

func TestMetricNames(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		expr string
		want []string
	}{
		{`sum(rate(orders_created_total[$__rate_interval]))`, []string{"orders_created_total"}},
		{`max by (message_type) (outbox_pending)`, []string{"outbox_pending"}},
		{`sum without(instance)(outbox_pending)`, []string{"outbox_pending"}},
		{`histogram_quantile(0.99, sum by (le, consumer_name) (rate(consumer_processing_duration_seconds_bucket{outcome="processed", x=~"a}b"}[5m])))`,
			[]string{"consumer_processing_duration_seconds_bucket"}},
		{`sum by (consumer_name) (rate(a_total[1m])) / on(consumer_name) group_left(status) sum by (consumer_name) (rate(b_total[1m] offset 5m))`,
			[]string{"a_total", "b_total"}},
		{`relay_in_flight > bool 1e3 and relay_broker_connected`, []string{"relay_in_flight", "relay_broker_connected"}},
		{`{__name__="inbox_rows", status="POISONED"}`, []string{"inbox_rows"}},
		{`count(relay_broker_connected)`, []string{"relay_broker_connected"}},
		{`vector(1)`, nil},
	} {
		got, err := metricNames(tc.expr)
		if err != nil {
			t.Errorf("metricNames(%q): %v", tc.expr, err)
			continue
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("metricNames(%q) = %q, want %q", tc.expr, got, tc.want)
		}
	}
	for _, bad := range []string{`rate(x[5m)`, `x{a="b"`, `x{a="b}`, `{__name__=~"outbox_.*"}`} {
		if got, err := metricNames(bad); err == nil {
			t.Errorf("metricNames(%q) = %q, want an error", bad, got)
		}
	}
}

func TestDocumentedMetrics(t *testing.T) {
	t.Parallel()
	docs, prefixes := documentedMetrics(t)
	// One of each kind of cell: a single name, a histogram, a cell listing
	// several names, a name from the last table.
	for _, name := range []string{"outbox_pending", "orders_completion_duration_seconds", "pgxpool_idle_connections", "pgxpool_max_connections", "http_server_response_body_size_bytes", "pgxpool_new_connections_total"} {
		if _, ok := docs[name]; !ok {
			t.Errorf("%s: %s not found in the metric tables (%d found): has the table format changed?", observabilityDoc, name, len(docs))
		}
	}
	if d := docs["outbox_confirm_latency_seconds"]; d.typ != "histogram" {
		t.Errorf("%s: outbox_confirm_latency_seconds has type %q, want histogram", observabilityDoc, d.typ)
	}
	// Label values and settings in backticks are not metrics.
	for _, notMetric := range []string{"confirmed", "RELAY_MAX_IN_FLIGHT", "POISONED"} {
		if _, ok := docs[notMetric]; ok {
			t.Errorf("%s: %q was read as a metric", observabilityDoc, notMetric)
		}
	}
	for _, p := range []string{"go_", "process_"} {
		if !slices.Contains(prefixes, p) {
			t.Errorf("%s: the `%s*` wildcard was not found (prefixes %q)", observabilityDoc, p, prefixes)
		}
	}
}

// TestDashboardUsesOnlyDocumentedMetrics fails on a query that names a
// metric docs/observability.md does not list: a renamed or removed metric
// would leave a panel silently empty.
func TestDashboardUsesOnlyDocumentedMetrics(t *testing.T) {
	t.Parallel()
	docs, prefixes := documentedMetrics(t)
	_, panels := loadDashboards(t)
	used := 0
	for _, p := range panels {
		for _, tg := range p.Targets {
			names, err := metricNames(tg.Expr)
			if err != nil {
				t.Errorf("%s, target %s: %v", p.where, tg.RefID, err)
				continue
			}
			if len(names) == 0 && strings.TrimSpace(tg.Expr) != "" {
				t.Errorf("%s, target %s: %q selects no metric", p.where, tg.RefID, tg.Expr)
			}
			for _, name := range names {
				if _, err := resolveMetric(name, docs, prefixes); err != nil {
					t.Errorf("%s, target %s: %v\n\texpr: %s", p.where, tg.RefID, err, tg.Expr)
				}
				used++
			}
		}
	}
	if used == 0 {
		t.Fatal("the dashboards select no metric at all")
	}
}

// datasourceUIDOf returns the uid of a panel's or target's datasource
// reference, "" when there is none.
func datasourceUIDOf(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var ref struct {
		UID string `json:"uid"`
	}
	if err := json.Unmarshal(raw, &ref); err != nil {
		return "", fmt.Errorf(`datasource %s: want {"type": "prometheus", "uid": %q}`, raw, datasourceUID)
	}
	return ref.UID, nil
}

func TestDashboardPanels(t *testing.T) {
	t.Parallel()
	dashboards, panels := loadDashboards(t)
	if d := dashboards["orders.json"]; d.UID != "orders-flow" || d.Title == "" {
		t.Errorf("orders.json: uid %q, title %q; want uid orders-flow and a title", d.UID, d.Title)
	}
	seen := map[string]map[int]string{} // file: id: panel
	for _, p := range panels {
		file, _, _ := strings.Cut(p.where, ":")
		if seen[file] == nil {
			seen[file] = map[int]string{}
		}
		if other, dup := seen[file][p.ID]; dup {
			t.Errorf("%s: id %d is also the id of %s", p.where, p.ID, other)
		}
		seen[file][p.ID] = p.where
		if p.ID == 0 {
			t.Errorf("%s: no id", p.where)
		}
		if strings.TrimSpace(p.Title) == "" {
			t.Errorf("%s: no title", p.where)
		}
		if g := p.GridPos; g == nil || g.W <= 0 || g.H <= 0 || g.X < 0 || g.Y < 0 || g.X+g.W > 24 {
			t.Errorf("%s: gridPos %+v is not inside the 24-column grid", p.where, g)
		}
		if p.Type == "row" {
			continue
		}
		if len(p.Targets) == 0 {
			t.Errorf("%s: no target", p.where)
		}
		panelUID, err := datasourceUIDOf(p.Datasource)
		if err != nil {
			t.Errorf("%s: %v", p.where, err)
		}
		if panelUID != "" && panelUID != datasourceUID {
			t.Errorf("%s: datasource uid %q, want %q (the provisioned Prometheus)", p.where, panelUID, datasourceUID)
		}
		refIDs := map[string]bool{}
		for i, tg := range p.Targets {
			if strings.TrimSpace(tg.Expr) == "" {
				t.Errorf("%s, target %d: no expr", p.where, i)
			}
			if tg.RefID == "" || refIDs[tg.RefID] {
				t.Errorf("%s, target %d: refId %q missing or repeated", p.where, i, tg.RefID)
			}
			refIDs[tg.RefID] = true
			uid, err := datasourceUIDOf(tg.Datasource)
			switch {
			case err != nil:
				t.Errorf("%s, target %s: %v", p.where, tg.RefID, err)
			case uid == "" && panelUID == "":
				t.Errorf("%s, target %s: no datasource, and the panel has none to inherit; want uid %q", p.where, tg.RefID, datasourceUID)
			case uid != "" && uid != datasourceUID:
				t.Errorf("%s, target %s: datasource uid %q, want %q", p.where, tg.RefID, uid, datasourceUID)
			}
		}
	}
}

var jobName = regexp.MustCompile(`(?m)^\s*-\s*job_name:\s*["']?([A-Za-z0-9_.-]+)["']?\s*$`)

// TestPrometheusScrapesEveryProcess checks prometheus.yml with plain text
// matching (the module has no YAML parser): one block per job, each with
// the target of its process.
func TestPrometheusScrapesEveryProcess(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile(prometheusConfig)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(raw), "\t") {
		t.Errorf("%s: YAML does not allow tabs for indentation", prometheusConfig)
	}
	// Drop the comments, then cut the file into one block per job.
	var b strings.Builder
	for line := range strings.Lines(string(raw)) {
		if before, _, found := strings.Cut(line, "#"); found {
			line = before + "\n"
		}
		b.WriteString(line)
	}
	text := b.String()
	global, _, _ := strings.Cut(text, "scrape_configs:")
	if !regexp.MustCompile(`(?m)^\s+scrape_interval:\s*5s\s*$`).MatchString(global) {
		t.Errorf("%s: want a global scrape_interval of 5s", prometheusConfig)
	}
	jobs := map[string]string{}
	locs := jobName.FindAllStringSubmatchIndex(text, -1)
	for k, loc := range locs {
		end := len(text)
		if k+1 < len(locs) {
			end = locs[k+1][0]
		}
		name := text[loc[2]:loc[3]]
		if _, dup := jobs[name]; dup {
			t.Errorf("%s: job %s is defined twice", prometheusConfig, name)
		}
		jobs[name] = text[loc[1]:end]
	}
	for _, want := range []struct {
		job      string
		patterns []string
	}{
		{"order-api", []string{`["']?order-api:8080["']?`}},
		// Every replica of the relay's compose service, through Docker's DNS.
		{"outbox-relay", []string{`dns_sd_configs:`, `names:\s*\[\s*["']?outbox-relay["']?\s*\]|-\s*["']?outbox-relay["']?\s*$`, `type:\s*["']?A["']?\s*$`, `port:\s*9101\s*$`}},
		{"order-consumer", []string{`dns_sd_configs:`, `names:\s*\[\s*["']?order-consumer["']?\s*\]|-\s*["']?order-consumer["']?\s*$`, `type:\s*["']?A["']?\s*$`, `port:\s*9102\s*$`}},
		{"prometheus", []string{`:9090`}},
	} {
		block, ok := jobs[want.job]
		if !ok {
			t.Errorf("%s: no job %q (jobs: %v)", prometheusConfig, want.job, slices.Sorted(maps.Keys(jobs)))
			continue
		}
		for _, p := range want.patterns {
			if !regexp.MustCompile(`(?m)` + p).MatchString(block) {
				t.Errorf("%s: job %s does not match %s:\n%s", prometheusConfig, want.job, p, block)
			}
		}
	}
}

// TestGrafanaProvisioning checks that Grafana gets the datasource the
// dashboards name and loads the dashboards from where compose mounts them.
func TestGrafanaProvisioning(t *testing.T) {
	t.Parallel()
	for _, want := range []struct {
		file     string
		patterns []string
	}{
		{datasourceConfig, []string{`type:\s*prometheus\s*$`, `uid:\s*["']?` + datasourceUID + `["']?\s*$`, `url:\s*["']?http://prometheus:9090["']?\s*$`, `isDefault:\s*true\s*$`}},
		{dashboardConfig, []string{`type:\s*file\s*$`, `path:\s*["']?/var/lib/grafana/dashboards["']?\s*$`}},
	} {
		raw, err := os.ReadFile(want.file)
		if err != nil {
			t.Error(err)
			continue
		}
		for _, p := range want.patterns {
			if !regexp.MustCompile(`(?m)` + p).Match(raw) {
				t.Errorf("%s: does not match %s", want.file, p)
			}
		}
	}
}
