// Package composesecrets makes the secrets of the docker compose stack,
// so that a stack started from a fresh clone, with nothing configured,
// runs with secrets of its own and never with the repository's: a password
// for each PostgreSQL role and RabbitMQ user, PostgreSQL's superuser and
// Grafana's administrator, order-api's token secret, and the Erlang cookie
// of a RabbitMQ cluster. Each is a file in the stack's secrets volume,
// which the services mount and read
// (DATABASE_PASSWORD_FILE, AMQP_PASSWORD_FILE, API_JWT_SECRET_FILE,
// POSTGRES_PASSWORD_FILE, ...); and the RabbitMQ definitions the broker
// imports at boot are rendered there, with the hashes of those passwords.
//
// cmd/compose-secrets runs Ensure at every `docker compose up`, before
// anything that needs a secret starts. A secret is taken from its variable
// (.env) when that is set, else kept from an earlier start, else
// generated. docs/security.md, "The secrets of docker compose".
package composesecrets

import (
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/yourorg/orders/internal/config"
	"github.com/yourorg/orders/internal/rabbitadmin"
)

// Dir is where the services of the stack mount the secrets volume.
const Dir = "/run/orders-secrets"

// RabbitMQDefinitions is the file, in the secrets directory, of the
// definitions the broker imports: the users of the repository's
// definitions files, with the hashes of their passwords.
const RabbitMQDefinitions = "rabbitmq-definitions.json"

// Secret is one secret of the stack.
type Secret struct {
	// File is its file in the secrets directory.
	File string
	// Variable is the variable of .env (passed on by docker compose) that
	// sets it; unset, the secret is generated at the first start and kept.
	Variable string
	// RabbitMQUser is the RabbitMQ user it is the password of, if any: its
	// hash goes into the rendered definitions.
	RabbitMQUser string
}

// Secrets are all the stack's secrets.
var Secrets = []Secret{
	{File: "api-jwt-secret", Variable: "ORDERS_API_JWT_SECRET"},
	{File: "postgres-password", Variable: "ORDERS_POSTGRES_PASSWORD"},
	{File: DBRoleFile("orders_migrate"), Variable: "ORDERS_DB_MIGRATE_PASSWORD"},
	{File: DBRoleFile("orders_api"), Variable: "ORDERS_DB_API_PASSWORD"},
	{File: DBRoleFile("orders_relay"), Variable: "ORDERS_DB_RELAY_PASSWORD"},
	// The log-tailing relay's replication role, made only when the stack
	// runs it (10-roles.sh); its password is kept either way.
	{File: DBRoleFile("orders_relay_wal"), Variable: "ORDERS_DB_RELAY_WAL_PASSWORD"},
	{File: DBRoleFile("orders_consumer"), Variable: "ORDERS_DB_CONSUMER_PASSWORD"},
	{File: DBRoleFile("orders_operator"), Variable: "ORDERS_DB_OPERATOR_PASSWORD"},
	rabbitMQ(rabbitadmin.AdminUser, "ORDERS_RABBITMQ_ADMIN_PASSWORD"),
	rabbitMQ(rabbitadmin.RelayUser, "ORDERS_RABBITMQ_RELAY_PASSWORD"),
	rabbitMQ(rabbitadmin.ConsumerUser, "ORDERS_RABBITMQ_CONSUMER_PASSWORD"),
	rabbitMQ(rabbitadmin.OperatorUser, "ORDERS_RABBITMQ_OPERATOR_PASSWORD"),
	rabbitMQ(rabbitadmin.WalkthroughUser, "ORDERS_RABBITMQ_WALKTHROUGH_PASSWORD"),
	{File: "grafana-admin-password", Variable: "ORDERS_GRAFANA_ADMIN_PASSWORD"},
	// The Erlang cookie of docker-compose.cluster.yml's RabbitMQ nodes:
	// who holds it can join the cluster and run code on its nodes.
	{File: ErlangCookieFile, Variable: "ORDERS_RABBITMQ_COOKIE"},
}

// ErlangCookieFile is the file of the Erlang cookie the RabbitMQ nodes of
// a cluster share; each node copies it to its own .erlang.cookie at start.
const ErlangCookieFile = "rabbitmq-erlang-cookie"

func rabbitMQ(user, variable string) Secret {
	return Secret{File: RabbitMQUserFile(user), Variable: variable, RabbitMQUser: user}
}

// DBRoleFile is the file of a PostgreSQL role's password.
func DBRoleFile(role string) string { return "db-" + role }

// RabbitMQUserFile is the file of a RabbitMQ user's password.
func RabbitMQUserFile(user string) string { return "rabbitmq-" + user }

// Ensure makes every secret in dir: from its variable (getenv) when set,
// else the one an earlier start made, else a new random one. It refuses a
// variable that holds a credential the repository publishes. Then it
// renders the RabbitMQ definitions of the files named (the repository's,
// without passwords) with the hashes of the users' passwords. It returns
// what it did, one line per secret, naming no value.
func Ensure(dir string, getenv func(string) string, definitions ...string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var report []string
	for _, s := range Secrets {
		path := filepath.Join(dir, s.File)
		old, err := os.ReadFile(path)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
		value := getenv(s.Variable)
		switch {
		case value != "" && config.DevelopmentCredential(value):
			return nil, fmt.Errorf("%s is a development credential, published in this repository: set your own, or leave it empty to have one generated", s.Variable)
		case value != "" && string(old) == value:
			report = append(report, s.File+": from "+s.Variable)
			continue
		case value != "" && len(old) > 0:
			report = append(report, s.File+": replaced from "+s.Variable+changeNote(s))
		case value != "":
			report = append(report, s.File+": from "+s.Variable)
		case len(old) > 0:
			report = append(report, s.File+": kept")
			continue
		default:
			value = rand.Text() + rand.Text() // 260 random bits, letters and digits
			report = append(report, s.File+": generated")
		}
		if err := writeFile(path, []byte(value)); err != nil {
			return nil, err
		}
	}
	if err := renderDefinitions(dir, definitions); err != nil {
		return nil, err
	}
	return append(report, RabbitMQDefinitions+": rendered from "+strings.Join(definitions, ", ")), nil
}

// changeNote says what a changed password does not change by itself.
func changeNote(s Secret) string {
	switch {
	case strings.HasPrefix(s.File, "db-"), s.File == "postgres-password":
		return " (PostgreSQL keeps the old password until ALTER ROLE: docs/security.md, \"Rotating a password\")"
	case s.RabbitMQUser != "":
		return " (the broker takes it when it imports the definitions: at its next start)"
	}
	return ""
}

// renderDefinitions writes the definitions of files, each user's
// password_hash that of its secret, to RabbitMQDefinitions in dir.
func renderDefinitions(dir string, files []string) error {
	d, err := rabbitadmin.ReadDefinitions(files...)
	if err != nil {
		return err
	}
	for i, u := range d.Users {
		s := slices.IndexFunc(Secrets, func(s Secret) bool { return s.RabbitMQUser == u.Name })
		if s < 0 {
			return fmt.Errorf("RabbitMQ user %s has no secret (composesecrets.Secrets)", u.Name)
		}
		password, err := os.ReadFile(filepath.Join(dir, Secrets[s].File))
		if err != nil {
			return err
		}
		d.Users[i].PasswordHash = rabbitadmin.HashPassword(string(password))
		d.Users[i].HashingAlgorithm = rabbitadmin.HashingAlgorithm
	}
	raw, err := json.MarshalIndent(d, "", "  ")
	if err != nil {
		return err
	}
	return writeFile(filepath.Join(dir, RabbitMQDefinitions), append(raw, '\n'))
}

// writeFile replaces path with content at once (a reader never sees half
// of it). The mode lets every service read it: they run as users of their
// own (PostgreSQL, RabbitMQ, Grafana, the binaries' nonroot), and only the
// services that need a secret mount the volume.
func writeFile(path string, content []byte) error {
	tmp := path + ".new"
	if err := os.WriteFile(tmp, content, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// Show returns the secret of file in dir: what a person needs to log in
// (the RabbitMQ UI's orders-admin, Grafana's admin).
func Show(dir, file string) (string, error) {
	if !slices.ContainsFunc(Secrets, func(s Secret) bool { return s.File == file }) {
		var files []string
		for _, s := range Secrets {
			files = append(files, s.File)
		}
		return "", fmt.Errorf("no secret %q: one of %s", file, strings.Join(files, ", "))
	}
	raw, err := os.ReadFile(filepath.Join(dir, file))
	if err != nil {
		return "", err
	}
	return string(raw), nil
}
