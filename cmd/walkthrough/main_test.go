package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/yourorg/orders/internal/testenv"
)

// variablesRead runs the walkthrough up to its flag parsing (-h stops it
// there) and records every environment variable it looks up.
func variablesRead(t *testing.T) map[string]bool {
	t.Helper()
	read := map[string]bool{}
	lookup := func(name string) (string, bool) {
		read[name] = true
		return "", false
	}
	var stderr bytes.Buffer
	err := run(context.Background(), []string{"-h"}, lookup, strings.NewReader(""), &bytes.Buffer{}, &stderr)
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("run -h: %v", err)
	}
	if len(read) == 0 {
		t.Fatal("the walkthrough read no variable")
	}
	return read
}

// The compose service of the walkthrough sets only variables it reads: a
// misspelt one would leave the default (localhost, wrong in a container).
func TestComposeSetsOnlyVariablesItReads(t *testing.T) {
	t.Parallel()
	testenv.ComposeSetsOnly(t, "walkthrough", slices.Collect(maps.Keys(variablesRead(t))))
}

// docs/walkthrough.md documents every variable the walkthrough reads.
func TestDocsListEveryVariable(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../../docs/walkthrough.md")
	if err != nil {
		t.Fatal(err)
	}
	for name := range variablesRead(t) {
		if !bytes.Contains(doc, []byte("`"+name+"`")) {
			t.Errorf("docs/walkthrough.md does not document %s", name)
		}
	}
}

func TestRejectsArguments(t *testing.T) {
	t.Parallel()
	none := func(string) (string, bool) { return "", false }
	err := run(context.Background(), []string{"-yes", "now"}, none, strings.NewReader(""), &bytes.Buffer{}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "unexpected arguments") {
		t.Fatalf("want an error naming the unexpected arguments, got %v", err)
	}
}

// With nothing listening, the walkthrough says what is missing and how to
// start it, instead of failing halfway through a step.
func TestSaysHowToStartTheSystem(t *testing.T) {
	t.Parallel()
	addr := testenv.FreeAddr(t) // nothing listens there
	env := map[string]string{"API_URL": "http://" + addr}
	lookup := func(name string) (string, bool) { v, ok := env[name]; return v, ok }
	err := run(context.Background(), []string{"-yes"}, lookup, strings.NewReader(""), &bytes.Buffer{}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "make dev") || !strings.Contains(err.Error(), "API_URL") {
		t.Fatalf("want an error naming API_URL and how to start the system, got %v", err)
	}
}
