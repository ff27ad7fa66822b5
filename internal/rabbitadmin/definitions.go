// Package rabbitadmin names the RabbitMQ users of the order service and
// what each may do, and creates them: through the management HTTP API when
// the broker has one (RabbitMQ in Docker), else with rabbitmqctl on this
// machine.
//
// The users and their permissions are written once, in
// deploy/rabbitmq/definitions.json, a RabbitMQ definitions file: docker
// compose's broker imports it at boot, make dev applies it with Apply
// (lab/rabbitmq-users), and the tests apply it to a vhost of their own and
// check every process against it. docs/messaging.md explains each regular
// expression.
package rabbitadmin

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
)

// The definitions files, from the repository's root: the users of the
// stack, and the user the demo adds (the walkthrough, which may publish to
// orders.events), which exists only where the demo runs. Neither holds a
// password: make dev gives each user its own (cmd/rabbitmq-users), and
// docker compose renders them with the passwords it generates
// (internal/composesecrets).
const (
	DefinitionsFile     = "deploy/rabbitmq/definitions.json"
	DemoDefinitionsFile = "deploy/rabbitmq/definitions.demo.json"
)

// The users, one per process (the administrator is for people: the
// management UI).
const (
	AdminUser       = "orders-admin"       // the management UI: administrator, everything
	RelayUser       = "orders-relay"       // outbox-relay
	ConsumerUser    = "orders-consumer"    // order-consumer
	OperatorUser    = "orders-operator"    // orderctl
	WalkthroughUser = "orders-walkthrough" // the walkthrough (a demo)
)

// HashingAlgorithm is the password hashing of the definitions file:
// RabbitMQ's default.
const HashingAlgorithm = "rabbit_password_hashing_sha256"

// Definitions is the part of a RabbitMQ definitions file this package
// reads: the vhosts, the users and their permissions.
type Definitions struct {
	Vhosts []struct {
		Name string `json:"name"`
	} `json:"vhosts"`
	Users            []User            `json:"users"`
	Permissions      []Permission      `json:"permissions"`
	TopicPermissions []TopicPermission `json:"topic_permissions,omitempty"`
}

// User is a user of a definitions file. The repository's files hold no
// password: a rendered file (internal/composesecrets) has its hash.
type User struct {
	Name             string   `json:"name"`
	PasswordHash     string   `json:"password_hash,omitempty"`
	HashingAlgorithm string   `json:"hashing_algorithm,omitempty"`
	Tags             []string `json:"tags"`
}

// Permissions are a user's three regular expressions in one vhost: the
// names of the exchanges and queues it may configure (declare, delete),
// write (publish to; bind a queue: write on the queue) and read (consume,
// get; bind: read on the exchange). RabbitMQ checks the default exchange
// under the name amq.default.
type Permissions struct {
	Configure string `json:"configure"`
	Write     string `json:"write"`
	Read      string `json:"read"`
}

// All is every permission: a test's own login in its own vhost.
var All = Permissions{Configure: ".*", Write: ".*", Read: ".*"}

// TopicPermissions narrow a user's permissions on one topic exchange to
// routing keys: those it may publish with (write) and bind a queue by
// (read). A user without them on an exchange may use any key there.
type TopicPermissions struct {
	Exchange string `json:"exchange"`
	Write    string `json:"write"`
	Read     string `json:"read"`
}

// TopicPermission is one entry of a definitions file's topic_permissions.
type TopicPermission struct {
	User  string `json:"user"`
	Vhost string `json:"vhost"`
	TopicPermissions
}

// Permission is one entry of a definitions file's permissions.
type Permission struct {
	User  string `json:"user"`
	Vhost string `json:"vhost"`
	Permissions
}

// ReadDefinitions reads definitions files, merged: their vhosts, users and
// permissions together. A user defined twice is an error.
func ReadDefinitions(paths ...string) (Definitions, error) {
	var all Definitions
	for _, path := range paths {
		raw, err := os.ReadFile(path)
		if err != nil {
			return Definitions{}, err
		}
		var d Definitions
		if err := json.Unmarshal(raw, &d); err != nil {
			return Definitions{}, fmt.Errorf("%s: %w", path, err)
		}
		for _, v := range d.Vhosts {
			if !slices.Contains(all.Vhosts, v) {
				all.Vhosts = append(all.Vhosts, v)
			}
		}
		for _, u := range d.Users {
			if _, twice := all.User(u.Name); twice {
				return Definitions{}, fmt.Errorf("%s: user %s is defined twice", path, u.Name)
			}
			all.Users = append(all.Users, u)
		}
		all.Permissions = append(all.Permissions, d.Permissions...)
		all.TopicPermissions = append(all.TopicPermissions, d.TopicPermissions...)
	}
	return all, nil
}

// User returns the user named name.
func (d Definitions) User(name string) (User, bool) {
	i := slices.IndexFunc(d.Users, func(u User) bool { return u.Name == name })
	if i < 0 {
		return User{}, false
	}
	return d.Users[i], true
}

// PermissionsOf returns user's permissions in vhost.
func (d Definitions) PermissionsOf(user, vhost string) (Permissions, bool) {
	i := slices.IndexFunc(d.Permissions, func(p Permission) bool { return p.User == user && p.Vhost == vhost })
	if i < 0 {
		return Permissions{}, false
	}
	return d.Permissions[i].Permissions, true
}

// TopicPermissionsOf returns user's topic permissions in vhost, one per
// exchange.
func (d Definitions) TopicPermissionsOf(user, vhost string) []TopicPermissions {
	var out []TopicPermissions
	for _, p := range d.TopicPermissions {
		if p.User == user && p.Vhost == vhost {
			out = append(out, p.TopicPermissions)
		}
	}
	return out
}

// DevPassword is the password make dev gives user unless told otherwise:
// the user's name, as RabbitMQ's own guest / guest. Fine for a laptop, and
// refused outside development (config.DevelopmentCredential);
// docs/operations.md says how to replace them.
func DevPassword(user string) string { return user }

// PasswordVariable is the environment variable that sets user's password
// for make dev: RABBITMQ_PASSWORD_ORDERS_RELAY for orders-relay.
func PasswordVariable(user string) string {
	return "RABBITMQ_PASSWORD_" + strings.ToUpper(strings.ReplaceAll(user, "-", "_"))
}

// HashPassword hashes password the way RabbitMQ's
// rabbit_password_hashing_sha256 does: base64 of a random 4-byte salt
// followed by SHA-256(salt + password). It is what a definitions file's
// password_hash holds.
func HashPassword(password string) string {
	salt := make([]byte, 4)
	_, _ = rand.Read(salt)
	return hashWithSalt(salt, password)
}

func hashWithSalt(salt []byte, password string) string {
	sum := sha256.Sum256(append(slices.Clone(salt), password...))
	return base64.StdEncoding.EncodeToString(append(slices.Clone(salt), sum[:]...))
}

// CheckPassword tells whether hash (a password_hash of
// rabbit_password_hashing_sha256) is the hash of password.
func CheckPassword(hash, password string) (bool, error) {
	raw, err := base64.StdEncoding.DecodeString(hash)
	if err != nil {
		return false, fmt.Errorf("password hash: %w", err)
	}
	if len(raw) != 4+sha256.Size {
		return false, errors.New("password hash: not a salted SHA-256 (36 bytes)")
	}
	return subtle.ConstantTimeCompare([]byte(hashWithSalt(raw[:4], password)), []byte(hash)) == 1, nil
}

// ProcessUsers are the users of the processes, those make dev creates.
var ProcessUsers = []string{RelayUser, ConsumerUser, OperatorUser, WalkthroughUser}

// Apply creates each of users (the names of d) on the broker of admin as
// rename(name), with password(name), and gives it in vhost the
// permissions (and topic permissions) d gives name in "/". It changes nothing else: a user that
// exists gets its password and permissions set again.
func Apply(ctx context.Context, admin Admin, d Definitions, vhost string, users []string, rename, password func(user string) string) error {
	for _, name := range users {
		u, ok := d.User(name)
		if !ok {
			return fmt.Errorf("%s has no user %s", DefinitionsFile, name)
		}
		p, ok := d.PermissionsOf(name, "/")
		if !ok {
			return fmt.Errorf("%s gives user %s no permissions in vhost /", DefinitionsFile, name)
		}
		if err := admin.PutUser(ctx, rename(name), password(name), u.Tags...); err != nil {
			return fmt.Errorf("create RabbitMQ user %s: %w", rename(name), err)
		}
		if err := admin.SetPermissions(ctx, vhost, rename(name), p); err != nil {
			return fmt.Errorf("set the permissions of RabbitMQ user %s in vhost %s: %w", rename(name), vhost, err)
		}
		for _, tp := range d.TopicPermissionsOf(name, "/") {
			if err := admin.SetTopicPermissions(ctx, vhost, rename(name), tp); err != nil {
				return fmt.Errorf("set the topic permissions of RabbitMQ user %s in vhost %s: %w", rename(name), vhost, err)
			}
		}
	}
	return nil
}
