package main

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/yourorg/orders/internal/domain"
	"github.com/yourorg/orders/internal/messaging"
	"github.com/yourorg/orders/internal/rabbitadmin"
	"github.com/yourorg/orders/internal/testenv"
)

func TestHash(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	if err := run(t.Context(), []string{"-hash", "s3cret"}, func(string) string { return "" }, &out); err != nil {
		t.Fatal(err)
	}
	if ok, err := rabbitadmin.CheckPassword(strings.TrimSpace(out.String()), "s3cret"); !ok || err != nil {
		t.Errorf("-hash s3cret printed %q, not a hash of it (%v)", out.String(), err)
	}
}

// make dev's step: the users created in AMQP_URL's vhost, with the
// passwords of the environment or their dev ones, and their URLs printed;
// a second run (make dev started again) changes nothing.
func TestCreatesTheUsers(t *testing.T) {
	t.Parallel()
	vhost := testenv.NewVhost(t)
	prefix := testenv.BrokerUserPrefix(t)
	var users []string
	for _, u := range rabbitadmin.ProcessUsers {
		users = append(users, prefix+u)
	}
	testenv.DeleteBrokerUsers(t, users...)
	env := map[string]string{"AMQP_URL": vhost, rabbitadmin.PasswordVariable(rabbitadmin.RelayUser): "from-the-env"}
	root := testenv.RepoRoot(t)
	args := []string{"-definitions", filepath.Join(root, rabbitadmin.DefinitionsFile) + "," + filepath.Join(root, rabbitadmin.DemoDefinitionsFile), "-prefix", prefix}
	var urls map[string]string
	for range 2 {
		var out bytes.Buffer
		if err := run(t.Context(), args, func(k string) string { return env[k] }, &out); err != nil {
			t.Fatal(err)
		}
		urls = map[string]string{}
		for line := range strings.Lines(out.String()) {
			user, url, _ := strings.Cut(strings.TrimSpace(line), " ")
			urls[user] = url
		}
	}
	if len(urls) != len(rabbitadmin.ProcessUsers) {
		t.Fatalf("printed %v, want a URL for each of %v", urls, rabbitadmin.ProcessUsers)
	}
	if !strings.Contains(urls[rabbitadmin.RelayUser], ":from-the-env@") || !strings.Contains(urls[rabbitadmin.ConsumerUser], ":orders-consumer@") {
		t.Errorf("passwords: %v", urls)
	}
	// Each logs in to the vhost; the relay declares its exchange, which the
	// operator may not.
	for user, url := range urls {
		conn, err := amqp.Dial(url)
		if err != nil {
			t.Errorf("%s: %v", user, err)
			continue
		}
		ch, err := conn.Channel()
		if err == nil {
			err = messaging.DeclareExchange(ch, domain.EventsExchange)
		}
		if allowed := user == rabbitadmin.RelayUser || user == rabbitadmin.ConsumerUser; (err == nil) != allowed {
			t.Errorf("%s declares orders.events: %v, want allowed %v", user, err, allowed)
		}
		_ = conn.Close()
	}
}
