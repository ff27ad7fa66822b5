// Command compose-secrets makes the secrets of the docker compose stack in
// its secrets volume (internal/composesecrets): docker-compose.yml runs it
// as a one-shot service before anything that needs a secret starts, at
// every `docker compose up`. A secret comes from its variable of .env when
// that is set, else from an earlier start, else it is generated; the
// RabbitMQ definitions the broker imports are rendered with the hashes of
// the users' passwords. It prints what it did, never a secret.
//
//	compose-secrets [-dir DIR] [-definitions FILE,...]   make the secrets
//	compose-secrets [-dir DIR] show NAME                 print one (a login for a person)
//
// For example, the password of the RabbitMQ management UI's orders-admin:
//
//	docker compose run --rm --no-deps secrets show rabbitmq-orders-admin
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/yourorg/orders/internal/composesecrets"
	"github.com/yourorg/orders/internal/rabbitadmin"
)

func main() {
	if err := run(os.Args[1:], os.Getenv, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "compose-secrets:", err)
		os.Exit(1)
	}
}

func run(args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("compose-secrets", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("dir", composesecrets.Dir, "the secrets directory (the volume)")
	definitions := fs.String("definitions", rabbitadmin.DefinitionsFile, "the RabbitMQ definitions files to render, comma-separated")
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch rest := fs.Args(); {
	case len(rest) == 2 && rest[0] == "show":
		secret, err := composesecrets.Show(*dir, rest[1])
		if err != nil {
			return err
		}
		_, err = fmt.Fprintln(stdout, secret)
		return err
	case len(rest) > 0:
		return fmt.Errorf("usage: compose-secrets [-dir DIR] [-definitions FILE,...] [show NAME], not %q", strings.Join(rest, " "))
	}
	report, err := composesecrets.Ensure(*dir, getenv, strings.Split(*definitions, ",")...)
	if err != nil {
		return err
	}
	for _, line := range report {
		_, _ = fmt.Fprintln(stdout, line)
	}
	return nil
}
