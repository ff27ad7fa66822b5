package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/yourorg/orders/internal/testenv"
	"github.com/yourorg/orders/migrations"
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

// With nothing where the variables point, the walkthrough names every
// part it cannot see, each with its variable, before step 1.
func TestNamesEverythingItCannotSee(t *testing.T) {
	t.Parallel()
	closed := testenv.FreeAddr(t) // nothing listens there
	env := map[string]string{
		"API_URL": "http://" + closed, "CONSUMER_ADMIN_URL": "http://" + closed, "WEBHOOK_RECEIVER_URL": "http://" + closed,
		"DATABASE_URL": "postgres://postgres@" + closed + "/orders?sslmode=disable", "AMQP_URL": "amqp://guest:guest@" + closed + "/",
	}
	lookup := func(name string) (string, bool) { v, ok := env[name]; return v, ok }
	err := run(context.Background(), []string{"-yes"}, lookup, strings.NewReader(""), &bytes.Buffer{}, &bytes.Buffer{})
	if err == nil {
		t.Fatal("the walkthrough ran against nothing")
	}
	for _, want := range []string{"API_URL", "CONSUMER_ADMIN_URL", "WEBHOOK_RECEIVER_URL", "DATABASE_URL", "AMQP_URL", `database "orders"`, `vhost "/"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error does not name %s:\n%v", want, err)
		}
	}
}

// A database and a vhost that answer but are not the running system's
// (order-api's newest order is not in the database, the consumers' queues
// are not in the vhost): the walkthrough refuses, naming both.
func TestRefusesAnotherSystemsDatabaseAndVhost(t *testing.T) {
	t.Parallel()
	db := testenv.NewDatabase(t) // migrated, and empty
	amqpURL := testenv.NewVhost(t)
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/readyz":
			_, _ = w.Write([]byte(`{"status":"ready"}`))
		case "/v1/orders": // an order of another database
			_, _ = w.Write([]byte(`{"orders":[{"order_id":"01a2b3c4-0000-7000-8000-000000000001"}],"next_cursor":null}`))
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(api.Close)
	env := map[string]string{
		"API_URL": api.URL, "CONSUMER_ADMIN_URL": api.URL, "WEBHOOK_RECEIVER_URL": "",
		"DATABASE_URL": db.URLAs(migrations.RoleOperator), "AMQP_URL": amqpURL, // as make dev and compose run it
	}
	lookup := func(name string) (string, bool) { v, ok := env[name]; return v, ok }
	err := run(context.Background(), []string{"-yes"}, lookup, strings.NewReader(""), &bytes.Buffer{}, &bytes.Buffer{})
	if err == nil {
		t.Fatal("the walkthrough ran against another system's database and vhost")
	}
	for _, want := range []string{
		"order-api writes to another database", `database "` + db.Name + `"`, "DATABASE_URL",
		"no queue orders.fulfillment", "not the vhost order-consumer uses", "AMQP_URL",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error does not say %q:\n%v", want, err)
		}
	}
}

// The walkthrough sends API_TOKEN to order-api; an API that refuses it is
// named, with how to get a token, before step 1.
func TestSendsItsTokenAndSaysWhenRefused(t *testing.T) {
	t.Parallel()
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/readyz":
			_, _ = w.Write([]byte(`{"status":"ready"}`))
		case r.URL.Path == "/v1/orders" && r.Header.Get("Authorization") == "Bearer the-token":
			_, _ = w.Write([]byte(`{"orders":[],"next_cursor":null}`))
		default:
			w.WriteHeader(http.StatusUnauthorized)
		}
	}))
	t.Cleanup(api.Close)
	closed := testenv.FreeAddr(t)
	for token, refused := range map[string]bool{"": true, "another": true, "the-token": false} {
		env := map[string]string{
			"API_URL": api.URL, "CONSUMER_ADMIN_URL": api.URL, "WEBHOOK_RECEIVER_URL": "", "API_TOKEN": token,
			"DATABASE_URL": "postgres://postgres@" + closed + "/orders?sslmode=disable", "AMQP_URL": "amqp://guest:guest@" + closed + "/",
		}
		lookup := func(name string) (string, bool) { v, ok := env[name]; return v, ok }
		err := run(context.Background(), []string{"-yes"}, lookup, strings.NewReader(""), &bytes.Buffer{}, &bytes.Buffer{})
		if err == nil {
			t.Fatal("the walkthrough ran against nothing")
		}
		if got := strings.Contains(err.Error(), "answers 401: it needs an operator's token (API_TOKEN"); got != refused {
			t.Errorf("API_TOKEN=%q: refusal named %v, want %v:\n%v", token, got, refused, err)
		}
	}
}
