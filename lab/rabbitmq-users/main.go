// Command rabbitmq-users creates the RabbitMQ users of the processes
// (outbox-relay, order-consumer, orderctl, the walkthrough) with the
// permissions of deploy/rabbitmq/definitions.json and definitions.demo.json
// (the walkthrough's): make dev runs it before
// it starts the processes. docker compose needs it not: its broker imports
// that file at boot.
//
//	rabbitmq-users [-definitions FILE,...] [-prefix P]
//	rabbitmq-users -hash PASSWORD   print a password_hash for the definitions file
//
// It logs in as AMQP_URL's user, who must be an administrator (guest on a
// local broker), through the management API (RABBITMQ_MANAGEMENT_URL, else
// port 15672 of AMQP_URL's host) when it answers, else with rabbitmqctl on
// this machine. Each user gets its permissions in AMQP_URL's vhost, and the
// password of RABBITMQ_PASSWORD_<USER> (RABBITMQ_PASSWORD_ORDERS_RELAY for
// orders-relay), else its dev password: its own name. A user that exists
// gets them again. It prints one line per user: its name and AMQP_URL
// logged in as it.
package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/signal"
	"strings"

	"github.com/yourorg/orders/internal/rabbitadmin"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "rabbitmq-users:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, getenv func(string) string, out io.Writer) error {
	fs := flag.NewFlagSet("rabbitmq-users", flag.ContinueOnError)
	definitions := fs.String("definitions", rabbitadmin.DefinitionsFile+","+rabbitadmin.DemoDefinitionsFile, "the definitions files, comma-separated")
	prefix := fs.String("prefix", "", "put this before every user name (tests: users are the broker's, not the vhost's)")
	hash := fs.String("hash", "", "print the password_hash of this password (rabbit_password_hashing_sha256), and do nothing else")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *hash != "" {
		_, err := fmt.Fprintln(out, rabbitadmin.HashPassword(*hash))
		return err
	}
	d, err := rabbitadmin.ReadDefinitions(strings.Split(*definitions, ",")...)
	if err != nil {
		return err
	}
	base, err := url.Parse(cmp.Or(getenv("AMQP_URL"), "amqp://guest:guest@127.0.0.1:5672/"))
	if err != nil {
		return fmt.Errorf("AMQP_URL: %w", err)
	}
	vhost := vhostOf(base)
	rename := func(user string) string { return *prefix + user }
	password := func(user string) string {
		return cmp.Or(getenv(rabbitadmin.PasswordVariable(user)), rabbitadmin.DevPassword(user))
	}
	admin := rabbitadmin.Local(ctx, base)
	if err := rabbitadmin.Apply(ctx, admin, d, vhost, rabbitadmin.ProcessUsers, rename, password); err != nil {
		return fmt.Errorf("%w (AMQP_URL's user must be an administrator of the broker)", err)
	}
	for _, user := range rabbitadmin.ProcessUsers {
		u := *base
		u.User = url.UserPassword(rename(user), password(user))
		_, _ = fmt.Fprintln(out, user, u.String())
	}
	return nil
}

// vhostOf is the vhost of an AMQP URL: its path without the leading slash,
// unescaped; "/" when there is none (amqp091-go's rule).
func vhostOf(u *url.URL) string {
	if len(u.Path) <= 1 {
		return "/"
	}
	return u.Path[1:]
}
