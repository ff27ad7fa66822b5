package deploy

import (
	"fmt"
	"maps"
	"net/url"
	"path"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/types"

	"github.com/yourorg/orders/internal/composesecrets"
	"github.com/yourorg/orders/internal/testenv"
	"github.com/yourorg/orders/migrations"
)

// The PostgreSQL role each binary connects as in compose (docs/security.md):
// its own, never the superuser; the migrate service as the schema's owner.
var composeDBRoles = map[string]string{
	"order-api":      migrations.RoleAPI,
	"outbox-relay":   migrations.RoleRelay,
	"order-consumer": migrations.RoleConsumer,
	"walkthrough":    migrations.RoleOperator,
	"orderctl":       migrations.RoleOperator,
}

// migrateRole owns the orders database and its schema in compose.
const migrateRole = "orders_migrate"

// passwordVariable is the variable of .env that sets a role's password
// (internal/composesecrets); the postgres service gives
// deploy/postgres/initdb/10-roles.sh the file of it, in passwordVariable +
// "_FILE".
func passwordVariable(role string) string {
	return "ORDERS_DB_" + strings.ToUpper(strings.TrimPrefix(role, "orders_")) + "_PASSWORD"
}

// passwordFile is the file of a role's password in the secrets volume.
func passwordFile(role string) string {
	return path.Join(composesecrets.Dir, composesecrets.DBRoleFile(role))
}

func TestComposeServicesConnectAsTheirRoles(t *testing.T) {
	t.Parallel()
	checkStacks(t, databaseRoleProblems)
	// Every service that needs the database is there to be checked.
	for _, files := range stacks {
		p := testenv.Compose(t, files...)
		var users []string
		for _, name := range serviceNames(p) {
			if u := databaseUser(p.Services[name]); u != "" {
				users = append(users, name+" as "+u)
			}
		}
		want := []string{"migrate as orders_migrate", "order-api as orders_api", "order-consumer as orders_consumer", "orderctl as orders_operator", "outbox-relay as orders_relay"}
		if slices.Contains(files, testenv.DemoComposeFile) {
			want = append(want, "walkthrough as orders_operator")
		}
		if !slices.Equal(users, want) {
			t.Errorf("%s: DATABASE_URL users %q, want %q", strings.Join(files, " + "), users, want)
		}
	}
}

// The init script creates every role a service connects as, with the
// password of its file, and gives orders_migrate the database; each
// role's password can be set in .env, or is generated
// (internal/composesecrets).
func TestInitScriptCreatesTheRoles(t *testing.T) {
	t.Parallel()
	script := readRepoFile(t, "deploy/postgres/initdb/10-roles.sh")
	roles := append([]string{migrateRole}, migrations.Roles...)
	for _, role := range append(roles, migrations.RoleRelayWAL) {
		create := regexp.MustCompile(`CREATE ROLE ` + role + ` LOGIN (?:REPLICATION )?PASSWORD :'(\w+)';`).FindStringSubmatch(script)
		if create == nil {
			t.Errorf("10-roles.sh does not create %s LOGIN with a password", role)
			continue
		}
		// REPLICATION reads every table: only the log-tailing relay's
		// replication role has it, made only when the stack runs that relay.
		if replicates := strings.Contains(create[0], "REPLICATION"); replicates != (role == migrations.RoleRelayWAL) {
			t.Errorf("10-roles.sh: %s REPLICATION %v; only %s may replicate", role, replicates, migrations.RoleRelayWAL)
		}
		if role == migrations.RoleRelayWAL {
			before, _, _ := strings.Cut(script, create[0])
			if i := strings.LastIndex(before, "\nif "); i < 0 || !strings.HasPrefix(before[i:], "\nif [[ ${ORDERS_RELAY_MODE:-poll} == wal ]]") {
				t.Errorf("10-roles.sh creates %s whatever ORDERS_RELAY_MODE", role)
			}
		}
		if !strings.Contains(script, "-v "+create[1]+`="$(<"$`+passwordVariable(role)+`_FILE")"`) {
			t.Errorf("10-roles.sh: the password of %s is not the file of %s_FILE", role, passwordVariable(role))
		}
		if !slices.ContainsFunc(composesecrets.Secrets, func(s composesecrets.Secret) bool {
			return s.File == composesecrets.DBRoleFile(role) && s.Variable == passwordVariable(role)
		}) {
			t.Errorf("composesecrets makes no %s from %s", composesecrets.DBRoleFile(role), passwordVariable(role))
		}
	}
	if !strings.Contains(script, `ALTER DATABASE :"db" OWNER TO `+migrateRole) {
		t.Errorf("10-roles.sh does not give the database to %s", migrateRole)
	}
	for _, doc := range []string{".env.example", "docs/security.md"} {
		text := readRepoFile(t, doc)
		for _, role := range append(roles, migrations.RoleRelayWAL) {
			if !strings.Contains(text, passwordVariable(role)) {
				t.Errorf("%s does not document %s", doc, passwordVariable(role))
			}
		}
	}
}

// databaseRoleProblems: every service that sets DATABASE_URL connects as
// its binary's role (composeDBRoles; `migrate` as orders_migrate), with no
// password in the URL but the role's file of the secrets volume, which the
// postgres service gives the init script that creates the roles.
func databaseRoleProblems(p *types.Project) []string {
	var problems []string
	var pg *types.ServiceConfig
	for _, name := range serviceNames(p) {
		if svc := p.Services[name]; strings.HasPrefix(svc.Image, "postgres:") {
			pg = &svc
		}
	}
	if pg != nil && !slices.ContainsFunc(pg.Volumes, func(v types.ServiceVolumeConfig) bool { return v.Target == "/docker-entrypoint-initdb.d" }) {
		problems = append(problems, fmt.Sprintf("service %s mounts no /docker-entrypoint-initdb.d: nothing creates the roles", pg.Name))
	}
	for _, name := range serviceNames(p) {
		svc := p.Services[name]
		raw := envValue(svc, "DATABASE_URL")
		if raw == "" {
			continue
		}
		u, err := url.Parse(raw)
		if err != nil || u.User == nil || u.User.Username() == "" {
			problems = append(problems, fmt.Sprintf("service %s: DATABASE_URL names no user", name))
			continue
		}
		binary := ""
		if len(svc.Entrypoint) > 0 {
			binary = path.Base(svc.Entrypoint[0])
		}
		want, ok := composeDBRoles[binary]
		if len(svc.Command) > 0 && svc.Command[0] == "migrate" {
			want, ok = migrateRole, true
		}
		if !ok {
			problems = append(problems, fmt.Sprintf("service %s runs %q, which has no database role: add it to composeDBRoles and docs/security.md", name, binary))
			continue
		}
		if got := u.User.Username(); got != want {
			problems = append(problems, fmt.Sprintf("service %s (%s) connects as %s, want %s", name, binary, got, want))
			continue
		}
		if _, has := u.User.Password(); has {
			problems = append(problems, fmt.Sprintf("service %s: DATABASE_URL carries %s's password: give it in DATABASE_PASSWORD_FILE", name, want))
			continue
		}
		if file := envValue(svc, "DATABASE_PASSWORD_FILE"); file != passwordFile(want) {
			problems = append(problems, fmt.Sprintf("service %s: DATABASE_PASSWORD_FILE is %q, want %s, %s's password", name, file, passwordFile(want), want))
		}
		if pg == nil {
			continue
		}
		if set := envValue(*pg, passwordVariable(want)+"_FILE"); set != passwordFile(want) {
			problems = append(problems, fmt.Sprintf("service %s: %s's password file is not the %s_FILE that service %s creates it with",
				name, want, passwordVariable(want), pg.Name))
		}
	}
	return problems
}

// databaseUser is the user of a service's DATABASE_URL, "" without one.
func databaseUser(svc types.ServiceConfig) string {
	u, err := url.Parse(envValue(svc, "DATABASE_URL"))
	if err != nil || u.User == nil {
		return ""
	}
	return u.User.Username()
}

func TestComposeRoleChecks(t *testing.T) {
	t.Parallel()
	const pg = "\n    image: postgres:15.8\n    volumes: [./initdb:/docker-entrypoint-initdb.d]\n" +
		"    environment: {ORDERS_DB_API_PASSWORD_FILE: /run/orders-secrets/db-orders_api, ORDERS_DB_MIGRATE_PASSWORD_FILE: /run/orders-secrets/db-orders_migrate}"
	apiWith := func(user, file string) string {
		return "\n    image: orders:dev\n    entrypoint: [/usr/local/bin/order-api]\n    environment: {DATABASE_URL: \"postgres://" + user + "@db:5432/orders\", DATABASE_PASSWORD_FILE: " + file + "}"
	}
	api := func(user string) string { return apiWith(user, "/run/orders-secrets/db-"+strings.Split(user, ":")[0]) }
	tests := []struct {
		name     string
		services map[string]string
		want     []string
	}{
		{"roles and password files", map[string]string{"db": pg, "api": api("orders_api"),
			"migrate": "\n    image: orders:dev\n    entrypoint: [/usr/local/bin/order-api]\n    command: [migrate, up]\n" +
				"    environment: {DATABASE_URL: \"postgres://orders_migrate@db/orders\", DATABASE_PASSWORD_FILE: /run/orders-secrets/db-orders_migrate}"}, nil},
		{"superuser", map[string]string{"db": pg, "api": api("postgres")}, []string{"service api (order-api) connects as postgres, want orders_api"}},
		{"another process's role", map[string]string{"db": pg, "api": api("orders_consumer")}, []string{"connects as orders_consumer, want orders_api"}},
		{"a password in the URL", map[string]string{"db": pg, "api": api("orders_api:a")}, []string{"DATABASE_URL carries orders_api's password"}},
		{"another role's file", map[string]string{"db": pg, "api": apiWith("orders_api", "/run/orders-secrets/db-orders_migrate")}, []string{"want /run/orders-secrets/db-orders_api"}},
		{"no user", map[string]string{"db": pg, "api": api("")}, []string{"DATABASE_URL names no user"}},
		{"unknown binary", map[string]string{"db": pg, "x": "\n    image: orders:dev\n    entrypoint: [/usr/local/bin/soak]\n    environment: {DATABASE_URL: \"postgres://postgres@db/orders\"}"}, []string{`runs "soak", which has no database role`}},
		{"no init script", map[string]string{"db": "\n    image: postgres:15.8", "api": api("orders_api")}, []string{"mounts no /docker-entrypoint-initdb.d", "is not the ORDERS_DB_API_PASSWORD_FILE"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var b strings.Builder
			b.WriteString("services:\n")
			for _, name := range slices.Sorted(maps.Keys(tt.services)) {
				fmt.Fprintf(&b, "  %s:%s\n", name, tt.services[name])
			}
			p, err := loadComposeDoc(t, b.String(), map[string]string{"initdb/10-roles.sh": ""})
			if err != nil {
				t.Fatal(err)
			}
			wantProblems(t, databaseRoleProblems(p), tt.want)
		})
	}
}
