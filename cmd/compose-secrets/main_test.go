package main

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"

	"github.com/yourorg/orders/internal/composesecrets"
	"github.com/yourorg/orders/internal/testenv"
)

// The command makes the secrets and prints what it did, never a secret;
// show prints one.
func TestMakeAndShow(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	root := testenv.RepoRoot(t)
	definitions := filepath.Join(root, "deploy/rabbitmq/definitions.json") + "," + filepath.Join(root, "deploy/rabbitmq/definitions.demo.json")
	var out bytes.Buffer
	if err := run([]string{"-dir", dir, "-definitions", definitions}, func(string) string { return "" }, &out, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "api-jwt-secret: generated") || !strings.Contains(out.String(), "rabbitmq-definitions.json: rendered") {
		t.Errorf("output:\n%s", out.String())
	}
	var shown bytes.Buffer
	if err := run([]string{"-dir", dir, "show", "grafana-admin-password"}, nil, &shown, &shown); err != nil {
		t.Fatal(err)
	}
	secret := strings.TrimSpace(shown.String())
	if len(secret) < 32 || strings.Contains(out.String(), secret) {
		t.Errorf("show printed %q; the first run's output holds it: %v", secret, strings.Contains(out.String(), secret))
	}
	if err := run([]string{"-dir", dir, "print"}, nil, &out, &out); err == nil {
		t.Error("an unknown command: no error")
	}
}

// The compose service of compose-secrets sets only the variables it reads:
// the .env variables of the secrets.
func TestComposeSetsOnlyVariablesItReads(t *testing.T) {
	t.Parallel()
	var variables []string
	for _, s := range composesecrets.Secrets {
		variables = append(variables, s.Variable)
	}
	testenv.ComposeSetsOnly(t, "compose-secrets", variables)
}
