package main

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/yourorg/orders/internal/consumer"
)

// api/asyncapi.yaml is what the generator writes today: the message types
// and versions with their payload schemas, the exchange, each consumer's
// queues and what they bind.
func TestAsyncAPIDocumentIsCurrent(t *testing.T) {
	t.Parallel()
	assertCurrent(t, "api/asyncapi.yaml", func(w io.Writer) error {
		return writeAsyncAPI(w, consumer.All(consumer.Deps{}), defaults)
	})
}

// docs/catalog.md is what the generator writes today: the message types,
// the consumers, what they read and their queues.
func TestCatalogPageIsCurrent(t *testing.T) {
	t.Parallel()
	assertCurrent(t, "docs/catalog.md", func(w io.Writer) error {
		return writeCatalog(w, consumer.All(consumer.Deps{}))
	})
}

// assertCurrent fails t when the committed file (a path from the root of the
// repository) is not what write makes.
func assertCurrent(t *testing.T, file string, write func(io.Writer) error) {
	t.Helper()
	var want bytes.Buffer
	if err := write(&want); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join("../../..", file))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want.Bytes()) {
		t.Errorf("%s is out of date: run `make generate`", file)
	}
}
