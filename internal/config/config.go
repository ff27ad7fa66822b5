// Package config reads a process's settings from the environment into one
// typed struct per binary, validates them, and describes them for the start-up
// log with secrets masked.
//
// A setting is a struct field with an `env` tag and an `envDefault`; a field
// tagged `secret:"true"` is never logged, one tagged `secret:"url"` (a URL
// that is a credential as a whole) only as its scheme and host, and every
// other value is logged through Redact, which masks the credentials a URL
// or a connection string carries. Each binary embeds the blocks it needs (Database, Log, ...) and
// adds its own knobs. A bad value fails start-up with a message that names
// the variable.
package config

import (
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"reflect"
	"strings"
	"time"

	"github.com/caarlos0/env/v11"

	"github.com/yourorg/orders/internal/auth"
	"github.com/yourorg/orders/internal/messaging/outbox"
)

// Validator is a config that checks itself after parsing.
type Validator interface {
	Validate() error
}

// Load fills cfg (a pointer to a struct) from environ, or from the process
// environment when environ is nil, reads the secrets it is given in files
// (secrets.go), then validates it. A config that embeds Environment is
// refused a credential this repository publishes, outside development.
func Load(cfg Validator, environ map[string]string) error {
	opts := env.Options{}
	lookup := os.LookupEnv
	if environ != nil {
		opts.Environment = environ
		lookup = func(k string) (string, bool) { v, ok := environ[k]; return v, ok }
	}
	if err := env.ParseWithOptions(cfg, opts); err != nil {
		return fmt.Errorf("configuration: %w", nameVariables(cfg, err))
	}
	if err := resolveFiles(cfg, lookup); err != nil {
		return fmt.Errorf("configuration: %w", err)
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("configuration: %w", err)
	}
	if e, ok := cfg.(hasEnvironment); ok && !e.environment().DevMode {
		if err := refuseDevelopmentCredentials(cfg); err != nil {
			return fmt.Errorf("configuration: %w", err)
		}
	}
	return nil
}

// nameVariables rewrites the parse errors of env, which name Go fields, to
// name the environment variables a user sets.
func nameVariables(cfg any, err error) error {
	var agg env.AggregateError
	if !errors.As(err, &agg) {
		return err
	}
	variables := map[string]string{}
	walk(reflect.ValueOf(cfg), func(f reflect.StructField, _ reflect.Value) {
		name, _, _ := strings.Cut(f.Tag.Get("env"), ",")
		variables[f.Name] = name
	})
	errs := make([]error, len(agg.Errors))
	for i, e := range agg.Errors {
		var pe env.ParseError
		if errors.As(e, &pe) && variables[pe.Name] != "" {
			e = fmt.Errorf("%s: %w", variables[pe.Name], pe.Err)
		}
		errs[i] = e
	}
	return errors.Join(errs...)
}

// Service is the configuration of a service binary: it embeds the
// Database, Log and Telemetry blocks (which give it the three methods
// below) and validates itself.
type Service interface {
	Validator
	DatabaseBlock() Database
	LogBlock() Log
	TelemetryBlock() Telemetry
}

// DatabaseBlock, LogBlock and TelemetryBlock return the blocks a service's
// configuration embeds (Service).
func (d Database) DatabaseBlock() Database    { return d }
func (l Log) LogBlock() Log                   { return l }
func (t Telemetry) TelemetryBlock() Telemetry { return t }

// Database is the PostgreSQL block every binary has.
type Database struct {
	// URL of the database; migrate creates the database if it is missing.
	// DATABASE_PASSWORD_FILE, when set, names a file with the password of
	// its user (docker compose's generated secrets).
	URL string `env:"DATABASE_URL" envDefault:"postgres://postgres@127.0.0.1:5432/orders?sslmode=disable" passwordFile:"DATABASE_PASSWORD_FILE"`
	// MaxConns caps the connection pool.
	MaxConns int32 `env:"DB_MAX_CONNS" envDefault:"10"`
	// MigrateOnStart applies pending migrations before serving.
	MigrateOnStart bool `env:"MIGRATE_ON_START" envDefault:"false"`
	// MigrateRelayWALRole makes migrate also make orders_relay_wal, the
	// log-tailing relay's replication role (RELAY_MODE=wal), with
	// REPLICATION; only a superuser may (store.RelayWALRole).
	MigrateRelayWALRole bool `env:"MIGRATE_RELAY_WAL_ROLE" envDefault:"false"`
	// StatementTimeout cancels a statement that runs longer (0: never).
	StatementTimeout time.Duration `env:"DB_STATEMENT_TIMEOUT" envDefault:"30s"`
	// LockTimeout cancels a statement that waits longer for a lock (0: never).
	LockTimeout time.Duration `env:"DB_LOCK_TIMEOUT" envDefault:"10s"`
	// ConnectTimeout is how long start-up (migrate, the first connection)
	// waits for a server that refuses connections or is still starting.
	ConnectTimeout time.Duration `env:"DB_CONNECT_TIMEOUT" envDefault:"30s"`
}

// Validate checks the database block.
func (d Database) Validate() error {
	var errs []error
	if _, err := url.Parse(d.URL); err != nil || d.URL == "" {
		errs = append(errs, errors.New("DATABASE_URL must be a postgres:// URL"))
	}
	if d.MaxConns < 1 {
		errs = append(errs, errors.New("DB_MAX_CONNS must be at least 1"))
	}
	if d.StatementTimeout < 0 || d.LockTimeout < 0 {
		errs = append(errs, errors.New("DB_STATEMENT_TIMEOUT and DB_LOCK_TIMEOUT must not be negative"))
	}
	if d.ConnectTimeout <= 0 {
		errs = append(errs, errors.New("DB_CONNECT_TIMEOUT must be positive"))
	}
	return errors.Join(errs...)
}

// Log is the logging block every binary has.
type Log struct {
	// Level is debug, info, warn or error.
	Level string `env:"LOG_LEVEL" envDefault:"info"`
	// Format is json or text.
	Format string `env:"LOG_FORMAT" envDefault:"json"`
}

// Validate checks the logging block.
func (l Log) Validate() error {
	var errs []error
	var level slog.Level
	if err := level.UnmarshalText([]byte(l.Level)); err != nil {
		errs = append(errs, fmt.Errorf("LOG_LEVEL %q: want debug, info, warn or error", l.Level))
	}
	if l.Format != "json" && l.Format != "text" {
		errs = append(errs, fmt.Errorf("LOG_FORMAT %q: want json or text", l.Format))
	}
	return errors.Join(errs...)
}

// SlogLevel is the parsed level (info when invalid; Validate reports that).
func (l Log) SlogLevel() slog.Level {
	var level slog.Level
	_ = level.UnmarshalText([]byte(l.Level))
	return level
}

// Telemetry is the OpenTelemetry block every binary has: OpenTelemetry's
// own variables. The OTLP exporters also read the rest of theirs
// (OTEL_EXPORTER_OTLP_HEADERS, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, ...) and
// the SDK reads OTEL_TRACES_SAMPLER and OTEL_RESOURCE_ATTRIBUTES.
type Telemetry struct {
	// ServiceName names the process in traces; default: the binary's name.
	ServiceName string `env:"OTEL_SERVICE_NAME"`
	// TracesExporter is otlp, console (JSON lines on stdout) or none.
	TracesExporter string `env:"OTEL_TRACES_EXPORTER" envDefault:"none"`
	// LogsExporter is otlp or none; logs always go to stdout as well.
	LogsExporter string `env:"OTEL_LOGS_EXPORTER" envDefault:"none"`
	// OTLPEndpoint is the collector (Jaeger, an OpenTelemetry Collector):
	// http://host:4318 for http/protobuf, http://host:4317 for grpc.
	OTLPEndpoint string `env:"OTEL_EXPORTER_OTLP_ENDPOINT"`
	// OTLPProtocol is http/protobuf or grpc.
	OTLPProtocol string `env:"OTEL_EXPORTER_OTLP_PROTOCOL" envDefault:"http/protobuf"`
}

// Validate checks the telemetry block.
func (t Telemetry) Validate() error {
	var errs []error
	switch t.TracesExporter {
	case "otlp", "console", "none":
	default:
		errs = append(errs, fmt.Errorf("OTEL_TRACES_EXPORTER %q: want otlp, console or none", t.TracesExporter))
	}
	switch t.LogsExporter {
	case "otlp", "none":
	default:
		errs = append(errs, fmt.Errorf("OTEL_LOGS_EXPORTER %q: want otlp or none", t.LogsExporter))
	}
	switch t.OTLPProtocol {
	case "http/protobuf", "grpc":
	default:
		errs = append(errs, fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL %q: want http/protobuf or grpc", t.OTLPProtocol))
	}
	return errors.Join(errs...)
}

// Positive reports an error naming variable when d is not above zero.
func Positive[T int | int32 | int64 | float64 | time.Duration](variable string, v T) error {
	if v <= 0 {
		return fmt.Errorf("%s must be greater than zero, got %v", variable, v)
	}
	return nil
}

// Named prefixes err, when there is one, with the variable it is about.
func Named(variable string, err error) error {
	if err != nil {
		return fmt.Errorf("%s: %w", variable, err)
	}
	return nil
}

// Partitions is the partition count the relays and the consumers share
// (MESSAGE_PARTITIONS): set it to the same number for both.
type Partitions struct {
	// MessagePartitions is the number of partitions: relays share them,
	// and each consumer has a queue per partition with a single active
	// consumer, so one order's messages are handled in order. 0 turns them
	// off (one work queue: two consumer replicas may handle an order's
	// messages out of order, and relays compete for rows). Default 8: up
	// to 8 relays and 8 consumer replicas share the work, at 8 quorum
	// queues per consumer; changing it later is a migration
	// (docs/scaling.md#changing-the-partitions).
	MessagePartitions int `env:"MESSAGE_PARTITIONS" envDefault:"8"`
}

// Validate checks the partition count.
func (p Partitions) Validate() error {
	if p.MessagePartitions < 0 || p.MessagePartitions > outbox.MaxPartitions {
		return fmt.Errorf("MESSAGE_PARTITIONS must be between 0 and %d, got %d", outbox.MaxPartitions, p.MessagePartitions)
	}
	return nil
}

// Setting is one environment variable of a config, as Describe sees it.
type Setting struct {
	Name    string
	Value   string // masked when secret
	Default string
}

// Describe lists the settings of cfg in field order, with the values as
// loaded: secrets as "*****", every other value through Redact.
func Describe(cfg any) []Setting {
	var out []Setting
	walk(reflect.ValueOf(cfg), func(f reflect.StructField, v reflect.Value) {
		name, _, _ := strings.Cut(f.Tag.Get("env"), ",")
		out = append(out, Setting{Name: name, Value: display(f, v), Default: f.Tag.Get("envDefault")})
	})
	return out
}

// Variables lists the names of the environment variables cfg reads: its
// settings', and the files some are read from (secrets.go).
func Variables(cfg any) []string {
	var names []string
	walk(reflect.ValueOf(cfg), func(f reflect.StructField, _ reflect.Value) {
		name, _, _ := strings.Cut(f.Tag.Get("env"), ",")
		names = append(names, name)
		names = append(names, fileVariables(f)...)
	})
	return names
}

// LogAttrs is Describe as slog attributes, for the one start-up line that
// says how the process is configured.
func LogAttrs(cfg any) []any {
	var attrs []any
	for _, s := range Describe(cfg) {
		attrs = append(attrs, slog.String(s.Name, s.Value))
	}
	return attrs
}

func walk(v reflect.Value, visit func(reflect.StructField, reflect.Value)) {
	for v.Kind() == reflect.Pointer {
		v = v.Elem()
	}
	t := v.Type()
	for i := range t.NumField() {
		f, fv := t.Field(i), v.Field(i)
		if !f.IsExported() {
			continue
		}
		if f.Tag.Get("env") == "" {
			if fv.Kind() == reflect.Struct && fv.Type() != reflect.TypeFor[time.Time]() {
				walk(fv, visit)
			}
			continue
		}
		visit(f, fv)
	}
}

func display(f reflect.StructField, v reflect.Value) string {
	switch f.Tag.Get("secret") {
	case "true":
		if v.IsZero() {
			return ""
		}
		return masked
	case "url":
		if v.IsZero() {
			return ""
		}
		return URLOrigin(fmt.Sprint(v.Interface()))
	}
	return Redact(fmt.Sprint(v.Interface()))
}

// URLOrigin is what may be logged of a URL that is itself a credential,
// such as a webhook's (a chat webhook's token in its path, a signature in
// its query): its scheme and host, "https://hooks.example.com/…". A field
// tagged `secret:"url"` is logged so.
func URLOrigin(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return masked
	}
	return u.Scheme + "://" + u.Host + "/…"
}

// masked replaces a secret in what is logged.
const masked = "*****"

// Redact returns s with the credentials it may carry masked, for logs:
//
//   - a URL (scheme://...): the password of its userinfo; the whole userinfo
//     of an http(s) URL, where a user name alone is a credential; and the
//     value of every query parameter whose name looks secret (password,
//     token, key, secret, signature, ...: see secretName);
//   - a PostgreSQL keyword/value connection string (host=db password=...):
//     the value of every keyword that looks secret;
//   - a list of URLs separated by commas (AMQP_URL's nodes of a cluster):
//     each URL as above.
//
// Anything else is returned as it is. Redact masks too much rather than too
// little: a masked value that was not secret costs a look at the
// environment, a logged secret costs a rotation.
func Redact(s string) string {
	if parts := strings.Split(s, ","); len(parts) > 1 && allURLs(parts) {
		for i, p := range parts {
			trimmed := strings.TrimSpace(p)
			parts[i] = strings.Replace(p, trimmed, Redact(trimmed), 1) // spaces around an item stay
		}
		return strings.Join(parts, ",")
	}
	if isURL(s) {
		return redactURL(s)
	}
	if strings.Contains(s, "=") {
		return redactKeywordValue(s)
	}
	return s
}

func isURL(s string) bool {
	scheme, _, ok := strings.Cut(strings.TrimSpace(s), "://")
	return ok && scheme != "" && !strings.ContainsAny(scheme, " =,")
}

// allURLs reports whether each of parts is a URL: a list of URLs, not a
// URL with commas in it (a PostgreSQL URL of several hosts).
func allURLs(parts []string) bool {
	for _, p := range parts {
		if !isURL(p) {
			return false
		}
	}
	return true
}

// redactURL masks the userinfo password and the secret query parameters
// of a URL. A URL that does not parse is masked whole after its scheme: it
// cannot be told apart safely.
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		scheme, _, _ := strings.Cut(s, "://")
		return scheme + "://" + masked
	}
	userMasked := false
	if u.User != nil {
		_, hasPassword := u.User.Password()
		switch {
		case u.Scheme == "http" || u.Scheme == "https":
			u.User, userMasked = url.User(masked), true
		case hasPassword:
			u.User, userMasked = url.UserPassword(u.User.Username(), masked), true
		}
	}
	u.RawQuery = redactQuery(u.RawQuery)
	if u.Fragment != "" {
		u.Fragment = masked // a fragment is client-side state, tokens included
	}
	out := u.String()
	if userMasked { // url.URL escapes the mask in userinfo; show it as elsewhere
		out = strings.Replace(out, url.PathEscape(masked), masked, 1)
	}
	return out
}

// redactQuery masks the values of the secret parameters of a raw query,
// keeping the order and encoding of the others.
func redactQuery(raw string) string {
	if raw == "" {
		return raw
	}
	params := strings.Split(raw, "&")
	for i, p := range params {
		rawName, _, hasValue := strings.Cut(p, "=")
		name := rawName
		if decoded, err := url.QueryUnescape(rawName); err == nil {
			name = decoded
		}
		if hasValue && secretName(name) {
			params[i] = rawName + "=" + masked
		}
	}
	return strings.Join(params, "&")
}

// redactKeywordValue masks the secret values of a libpq keyword/value
// connection string: keyword = value pairs separated by spaces, where a
// value may be single-quoted with \' and \\ escapes.
func redactKeywordValue(s string) string {
	var out strings.Builder
	i := 0
	for i < len(s) {
		// Spaces between pairs.
		start := i
		for i < len(s) && isSpace(s[i]) {
			i++
		}
		out.WriteString(s[start:i])
		if i == len(s) {
			break
		}
		// The keyword, up to "=" or a space.
		start = i
		for i < len(s) && s[i] != '=' && !isSpace(s[i]) {
			i++
		}
		keyword := s[start:i]
		out.WriteString(keyword)
		// Spaces, "=", spaces.
		start = i
		for i < len(s) && isSpace(s[i]) {
			i++
		}
		if i == len(s) || s[i] != '=' {
			// Not keyword/value after all: mask the rest, to be safe.
			out.WriteString(s[start:i])
			if i < len(s) {
				out.WriteString(masked)
			}
			break
		}
		i++
		for i < len(s) && isSpace(s[i]) {
			i++
		}
		out.WriteString(s[start:i])
		// The value: quoted, or up to the next space.
		start = i
		if i < len(s) && s[i] == '\'' {
			i++
			for i < len(s) && s[i] != '\'' {
				if s[i] == '\\' {
					i++
				}
				i++
			}
			i = min(i+1, len(s)) // the closing quote
		} else {
			for i < len(s) && !isSpace(s[i]) {
				if s[i] == '\\' {
					i++
				}
				i++
			}
			i = min(i, len(s))
		}
		if secretName(keyword) {
			out.WriteString(masked)
		} else {
			out.WriteString(s[start:i])
		}
	}
	return out.String()
}

func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'
}

// secretName reports whether a query parameter or a connection keyword
// names a credential: password, sslpassword, token, access_token, api_key,
// apikey, secret, client_secret, signature, sig, X-Amz-Signature,
// X-Amz-Credential, auth, authorization, and Azure's code.
func secretName(name string) bool {
	name = strings.ToLower(name)
	if name == "code" {
		return true
	}
	for _, part := range []string{"pass", "pwd", "token", "key", "secret", "sig", "auth", "credential"} {
		if strings.Contains(name, part) {
			return true
		}
	}
	return false
}

// Auth is the authentication block of order-api: how callers prove who
// they are (internal/auth, README "Authentication").
type Auth struct {
	// Mode is jwt (every request under /v1/ and /ui/ needs a bearer token)
	// or off (every request is an operator's: local experiments only).
	Mode string `env:"API_AUTH" envDefault:"jwt"`
	// JWTSecret verifies HS256 tokens; at least 32 bytes. Or
	// API_JWT_SECRET_FILE names a file that holds it.
	JWTSecret string `env:"API_JWT_SECRET" secret:"true" fromFile:"API_JWT_SECRET_FILE"`
	// JWTPublicKeys is a PEM file of public keys (RSA, ECDSA, Ed25519) that
	// verify the tokens of an identity provider.
	JWTPublicKeys string `env:"API_JWT_PUBLIC_KEYS"`
	// JWTIssuer, when set, must be every token's iss.
	JWTIssuer string `env:"API_JWT_ISSUER"`
	// JWTAudience, when set, must be among every token's aud; required
	// with JWTPublicKeys (an identity provider signs the tokens of all its
	// clients with the same keys).
	JWTAudience string `env:"API_JWT_AUDIENCE"`
}

// Validate checks the authentication block, the public keys file included.
func (a Auth) Validate() error {
	switch a.Mode {
	case "off":
		return nil
	case "jwt":
	default:
		return fmt.Errorf("API_AUTH %q: want jwt or off", a.Mode)
	}
	var errs []error
	if a.JWTSecret == "" && a.JWTPublicKeys == "" {
		errs = append(errs, errors.New("API_AUTH=jwt needs API_JWT_SECRET or API_JWT_PUBLIC_KEYS (or both) to verify tokens with; "+
			"API_AUTH=off turns authentication off"))
	}
	if a.JWTSecret != "" && len(a.JWTSecret) < auth.MinSecretLen {
		errs = append(errs, fmt.Errorf("API_JWT_SECRET is %d bytes, want at least %d", len(a.JWTSecret), auth.MinSecretLen))
	}
	if a.JWTPublicKeys != "" {
		if _, err := a.publicKeys(); err != nil {
			errs = append(errs, err)
		}
		if a.JWTAudience == "" {
			errs = append(errs, errors.New("API_JWT_PUBLIC_KEYS needs API_JWT_AUDIENCE, the audience the identity provider "+
				"puts in the tokens it issues for this API: it signs the tokens of all its clients with the same keys"))
		}
	}
	return errors.Join(errs...)
}

func (a Auth) publicKeys() ([]byte, error) {
	if a.JWTPublicKeys == "" {
		return nil, nil
	}
	raw, err := os.ReadFile(a.JWTPublicKeys)
	if err != nil {
		return nil, fmt.Errorf("API_JWT_PUBLIC_KEYS: %w", err)
	}
	if _, err := auth.ParsePublicKeys(raw); err != nil {
		return nil, fmt.Errorf("API_JWT_PUBLIC_KEYS %s: %w", a.JWTPublicKeys, err)
	}
	return raw, nil
}

// Verifier returns the verifier of the block: auth.Off() for API_AUTH=off.
func (a Auth) Verifier() (*auth.Verifier, error) {
	if a.Mode == "off" {
		return auth.Off(), nil
	}
	keys, err := a.publicKeys()
	if err != nil {
		return nil, err
	}
	v, err := auth.NewVerifier(auth.Options{
		Secret: []byte(a.JWTSecret), PublicKeysPEM: keys, Issuer: a.JWTIssuer, Audience: a.JWTAudience,
	})
	if err != nil {
		return nil, fmt.Errorf("API_JWT_SECRET, API_JWT_PUBLIC_KEYS: %w", err)
	}
	return v, nil
}
