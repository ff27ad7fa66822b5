package config

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
)

// Secrets from files, and the credentials this repository publishes.
//
// A secret can be given in a file rather than in the environment, as
// docker compose's generated secrets (cmd/compose-secrets), Docker and
// Kubernetes secrets give them. Two struct tags say so:
//
//   - `fromFile:"API_JWT_SECRET_FILE"` on a setting: that variable names a
//     file whose content (a trailing newline dropped) is the setting's
//     value. Setting both is an error.
//   - `passwordFile:"DATABASE_PASSWORD_FILE"` on a URL setting: that
//     variable names a file whose content is the password of the URL's
//     user; the URL names the user and no password. An empty URL (an
//     optional one) takes none.
//
// A process refuses to start with a credential this repository publishes
// (the development JWT secret, the passwords of make dev and of older
// docker compose files), unless it runs in development: DEV_MODE=true,
// which it then says with a WARN line at start.

// resolveFiles reads the settings of cfg that lookup names files for.
func resolveFiles(cfg any, lookup func(string) (string, bool)) error {
	var errs []error
	walk(reflect.ValueOf(cfg), func(f reflect.StructField, v reflect.Value) {
		name, _, _ := strings.Cut(f.Tag.Get("env"), ",")
		if fileVar := f.Tag.Get("fromFile"); fileVar != "" {
			if path, ok := lookup(fileVar); ok && path != "" {
				if inline, ok := lookup(name); ok && inline != "" {
					errs = append(errs, fmt.Errorf("%s and %s are both set: give the secret once", name, fileVar))
					return
				}
				secret, err := readSecretFile(fileVar, path)
				if err != nil {
					errs = append(errs, err)
					return
				}
				v.SetString(secret)
			}
		}
		if fileVar := f.Tag.Get("passwordFile"); fileVar != "" && v.String() != "" { // an optional URL left empty takes none
			if path, ok := lookup(fileVar); ok && path != "" {
				withPassword, err := URLWithPasswordFile(v.String(), path)
				if err != nil {
					errs = append(errs, fmt.Errorf("%s, %s: %w", name, fileVar, err))
					return
				}
				v.SetString(withPassword)
			}
		}
	})
	return errors.Join(errs...)
}

// readSecretFile reads the secret in path, which variable names.
func readSecretFile(variable, path string) (string, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("%s: %w", variable, err)
	}
	secret := strings.TrimRight(string(raw), "\r\n")
	if secret == "" {
		return "", fmt.Errorf("%s: %s is empty", variable, path)
	}
	return secret, nil
}

// URLWithPasswordFile returns rawURL with the password of its user read
// from the file at path (a trailing newline dropped): a DATABASE_URL or
// AMQP_URL whose password is a file's. An AMQP_URL that lists the nodes of
// a cluster gets the password in each URL.
func URLWithPasswordFile(rawURL, path string) (string, error) {
	if parts := strings.Split(rawURL, ","); len(parts) > 1 && allURLs(parts) {
		for i, part := range parts {
			withPassword, err := URLWithPasswordFile(strings.TrimSpace(part), path)
			if err != nil {
				return "", fmt.Errorf("URL %d of %d: %w", i+1, len(parts), err)
			}
			parts[i] = withPassword
		}
		return strings.Join(parts, ","), nil
	}
	u, err := url.Parse(rawURL)
	if err != nil || u.Host == "" {
		return "", errors.New("a password file needs the URL form (scheme://user@host/...)")
	}
	if u.User == nil || u.User.Username() == "" {
		return "", errors.New("the URL names no user for the password file's password")
	}
	if _, has := u.User.Password(); has {
		return "", errors.New("the URL has a password already: give it once")
	}
	password, err := readSecretFile("the password file", path)
	if err != nil {
		return "", err
	}
	u.User = url.UserPassword(u.User.Username(), password)
	return u.String(), nil
}

// fileVariables lists the file variables of field f, for Variables.
func fileVariables(f reflect.StructField) []string {
	var out []string
	for _, tag := range []string{"fromFile", "passwordFile"} {
		if v := f.Tag.Get(tag); v != "" {
			out = append(out, v)
		}
	}
	return out
}

// Environment says whether a process runs on a developer's machine. Every
// binary that takes a credential embeds it.
type Environment struct {
	// DevMode lets the process start with a credential this repository
	// publishes (DevelopmentCredential), and it says so with a WARN line at
	// start. make dev and the other make targets set it (scripts/env.sh);
	// anywhere else the process refuses those credentials.
	DevMode bool `env:"DEV_MODE" envDefault:"false"`
}

// environment lets Load find the block in any config that embeds it.
func (e Environment) environment() Environment { return e }

type hasEnvironment interface{ environment() Environment }

// WarnDevelopment writes the WARN line of a process that runs in
// development (cfg embeds Environment, with DEV_MODE=true), and nothing
// otherwise.
func WarnDevelopment(ctx context.Context, log *slog.Logger, cfg any) {
	if e, ok := cfg.(hasEnvironment); ok && e.environment().DevMode {
		log.WarnContext(ctx, "DEV_MODE=true: this process accepts the development credentials published in the "+
			"repository (anyone can mint an operator's token with its JWT secret); for a machine of your own only, "+
			"never where others can reach it")
	}
}

// DevelopmentJWTSecret is the API's token secret of make dev, make run and
// make token: public, in this repository.
const DevelopmentJWTSecret = "dev-only-order-api-jwt-secret-not-for-production"

// developmentPasswords are the database and broker passwords this
// repository publishes: those of docker compose before it generated its
// secrets (PostgreSQL's superuser and the roles' defaults), and those of
// make dev's RabbitMQ users (each user's name; rabbitadmin.DevPassword).
// RabbitMQ's own guest / guest is not among them: the broker lets guest in
// from its own machine only, and the tests and make dev use it there.
var developmentPasswords = []string{
	"postgres", "migrate-dev", "api-dev", "relay-dev", "consumer-dev", "operator-dev",
	"orders-admin", "orders-relay", "orders-consumer", "orders-operator", "orders-walkthrough",
}

// DevelopmentCredential reports whether secret is a credential this
// repository publishes: the development JWT secret or a development
// password.
func DevelopmentCredential(secret string) bool {
	return secret == DevelopmentJWTSecret || slices.Contains(developmentPasswords, secret)
}

// keywordPassword finds password=... in a keyword/value connection string.
var keywordPassword = regexp.MustCompile(`(?:^|\s)password\s*=\s*(?:'((?:[^'\\]|\\.)*)'|(\S+))`)

// refuseDevelopmentCredentials reports every setting of cfg that holds a
// development credential: a secret setting's value, or the password of a
// URL or of a keyword/value connection string.
func refuseDevelopmentCredentials(cfg any) error {
	var errs []error
	walk(reflect.ValueOf(cfg), func(f reflect.StructField, v reflect.Value) {
		if v.Kind() != reflect.String || v.String() == "" {
			return
		}
		name, _, _ := strings.Cut(f.Tag.Get("env"), ",")
		value := v.String()
		// A secret's value (a user or service name may be spelt like a
		// password of make dev's: orders-relay).
		if f.Tag.Get("secret") == "true" && DevelopmentCredential(value) {
			errs = append(errs, fmt.Errorf("%s is a development credential, published in this repository", name))
			return
		}
		var password string
		if u, err := url.Parse(value); err == nil && u.User != nil {
			password, _ = u.User.Password()
		} else if m := keywordPassword.FindStringSubmatch(value); m != nil {
			password = m[1] + m[2]
		}
		if password != "" && DevelopmentCredential(password) {
			errs = append(errs, fmt.Errorf("%s carries a development password, published in this repository", name))
		}
	})
	if len(errs) > 0 {
		errs = append(errs, errors.New("outside development, set your own secrets (docker compose generates them; "+
			"docs/security.md), or run with DEV_MODE=true on a machine of your own"))
	}
	return errors.Join(errs...)
}
