package main

import (
	"bytes"
	"context"
	"testing"

	"github.com/yourorg/orders/internal/testenv"
)

// docker-compose.yml gives webhook-receiver only variables it reads (those
// run looks up before it listens: a bad FAIL_FIRST stops it there).
func TestComposeSetsOnlyVariablesItReads(t *testing.T) {
	t.Parallel()
	var read []string
	getenv := func(name string) string {
		read = append(read, name)
		if name == "FAIL_FIRST" {
			return "many"
		}
		return ""
	}
	if err := run(context.Background(), getenv, &bytes.Buffer{}); err == nil {
		t.Fatal("run accepted FAIL_FIRST=many")
	}
	testenv.ComposeSetsOnly(t, "webhook-receiver", read)
}
