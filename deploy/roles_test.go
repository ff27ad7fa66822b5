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

// passwordVariable is the variable of the postgres service that holds a
// role's password for deploy/postgres/initdb/10-roles.sh.
func passwordVariable(role string) string {
	return "ORDERS_DB_" + strings.ToUpper(strings.TrimPrefix(role, "orders_")) + "_PASSWORD"
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
// password of its variable, and gives orders_migrate the database.
func TestInitScriptCreatesTheRoles(t *testing.T) {
	t.Parallel()
	script := readRepoFile(t, "deploy/postgres/initdb/10-roles.sh")
	for _, role := range append([]string{migrateRole}, migrations.Roles...) {
		create := regexp.MustCompile(`CREATE ROLE ` + role + ` LOGIN PASSWORD :'(\w+)';`).FindStringSubmatch(script)
		if create == nil {
			t.Errorf("10-roles.sh does not create %s LOGIN with a password", role)
			continue
		}
		if !strings.Contains(script, "-v "+create[1]+`="$`+passwordVariable(role)+`"`) {
			t.Errorf("10-roles.sh: the password of %s is not %s", role, passwordVariable(role))
		}
	}
	if !strings.Contains(script, `ALTER DATABASE :"db" OWNER TO `+migrateRole) {
		t.Errorf("10-roles.sh does not give the database to %s", migrateRole)
	}
	for _, doc := range []string{".env.example", "docs/security.md"} {
		text := readRepoFile(t, doc)
		for _, role := range append([]string{migrateRole}, migrations.Roles...) {
			if !strings.Contains(text, passwordVariable(role)) {
				t.Errorf("%s does not document %s", doc, passwordVariable(role))
			}
		}
	}
}

// databaseRoleProblems: every service that sets DATABASE_URL connects as
// its binary's role (composeDBRoles; `migrate` as orders_migrate) with the
// password the postgres service gives that role, and the postgres service
// runs the init script that creates them.
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
		if pg == nil {
			continue
		}
		password, _ := u.User.Password()
		if set := envValue(*pg, passwordVariable(want)); set == "" || set != password {
			problems = append(problems, fmt.Sprintf("service %s: the password of %s in DATABASE_URL is not the %s that service %s creates it with",
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
	const pg = "\n    image: postgres:15.8\n    volumes: [./initdb:/docker-entrypoint-initdb.d]\n    environment: {ORDERS_DB_API_PASSWORD: a, ORDERS_DB_MIGRATE_PASSWORD: m}"
	api := func(user string) string {
		return "\n    image: orders:dev\n    entrypoint: [/usr/local/bin/order-api]\n    environment: {DATABASE_URL: \"postgres://" + user + "@db:5432/orders\"}"
	}
	tests := []struct {
		name     string
		services map[string]string
		want     []string
	}{
		{"roles and passwords", map[string]string{"db": pg, "api": api("orders_api:a"),
			"migrate": "\n    image: orders:dev\n    entrypoint: [/usr/local/bin/order-api]\n    command: [migrate, up]\n    environment: {DATABASE_URL: \"postgres://orders_migrate:m@db/orders\"}"}, nil},
		{"superuser", map[string]string{"db": pg, "api": api("postgres:postgres")}, []string{"service api (order-api) connects as postgres, want orders_api"}},
		{"another process's role", map[string]string{"db": pg, "api": api("orders_consumer:a")}, []string{"connects as orders_consumer, want orders_api"}},
		{"wrong password", map[string]string{"db": pg, "api": api("orders_api:b")}, []string{"the password of orders_api in DATABASE_URL is not the ORDERS_DB_API_PASSWORD"}},
		{"no user", map[string]string{"db": pg, "api": api("")}, []string{"DATABASE_URL names no user"}},
		{"unknown binary", map[string]string{"db": pg, "x": "\n    image: orders:dev\n    entrypoint: [/usr/local/bin/soak]\n    environment: {DATABASE_URL: \"postgres://postgres@db/orders\"}"}, []string{`runs "soak", which has no database role`}},
		{"no init script", map[string]string{"db": "\n    image: postgres:15.8", "api": api("orders_api:a")}, []string{"mounts no /docker-entrypoint-initdb.d", "is not the ORDERS_DB_API_PASSWORD"}},
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
