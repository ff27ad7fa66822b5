package rabbitadmin_test

import (
	"path/filepath"
	"slices"
	"testing"

	"github.com/yourorg/orders/internal/config"
	"github.com/yourorg/orders/internal/rabbitadmin"
	"github.com/yourorg/orders/internal/testenv"
)

func TestHashPassword(t *testing.T) {
	t.Parallel()
	hash := rabbitadmin.HashPassword("s3cret")
	if ok, err := rabbitadmin.CheckPassword(hash, "s3cret"); !ok || err != nil {
		t.Errorf("CheckPassword(HashPassword(s3cret), s3cret) = %v, %v", ok, err)
	}
	if ok, _ := rabbitadmin.CheckPassword(hash, "s3cret!"); ok {
		t.Error("another password checks")
	}
	if rabbitadmin.HashPassword("s3cret") == hash {
		t.Error("two hashes of one password are equal: no salt")
	}
	// A hash RabbitMQ made (rabbitmqctl export_definitions of guest / guest).
	if ok, err := rabbitadmin.CheckPassword("gh0FK+PRchOw5dCd84Yu3/4dhMupNHaXXjVioICBSGrcRHvl", "guest"); !ok || err != nil {
		t.Errorf("RabbitMQ's hash of guest: %v, %v", ok, err)
	}
}

// TestDefinitionsFile checks the files the brokers' users come from: the
// stack's (an administrator and a user per process) and the demo's (the
// walkthrough, which may publish to orders.events, and exists only where
// the demo runs). Neither holds a password, nor a hash of one: a password
// in the repository would be everyone's (make dev and docker compose give
// each user its own). Every user has permissions in the one vhost; there
// is no guest, and one administrator.
func TestDefinitionsFile(t *testing.T) {
	t.Parallel()
	root := testenv.RepoRoot(t)
	stack, err := rabbitadmin.ReadDefinitions(filepath.Join(root, rabbitadmin.DefinitionsFile))
	if err != nil {
		t.Fatal(err)
	}
	demo, err := rabbitadmin.ReadDefinitions(filepath.Join(root, rabbitadmin.DemoDefinitionsFile))
	if err != nil {
		t.Fatal(err)
	}
	users := func(d rabbitadmin.Definitions) []string {
		var names []string
		for _, u := range d.Users {
			names = append(names, u.Name)
		}
		slices.Sort(names)
		return names
	}
	if got, want := users(stack), []string{rabbitadmin.AdminUser, rabbitadmin.ConsumerUser, rabbitadmin.OperatorUser, rabbitadmin.RelayUser}; !slices.Equal(got, want) {
		t.Errorf("%s: users %v, want %v", rabbitadmin.DefinitionsFile, got, want)
	}
	if got, want := users(demo), []string{rabbitadmin.WalkthroughUser}; !slices.Equal(got, want) {
		t.Errorf("%s: users %v, want %v", rabbitadmin.DemoDefinitionsFile, got, want)
	}
	d, err := rabbitadmin.ReadDefinitions(filepath.Join(root, rabbitadmin.DefinitionsFile), filepath.Join(root, rabbitadmin.DemoDefinitionsFile))
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Vhosts) != 1 || d.Vhosts[0].Name != "/" {
		t.Errorf("vhosts %v, want just /", d.Vhosts)
	}
	for _, u := range d.Users {
		if u.PasswordHash != "" || u.HashingAlgorithm != "" {
			t.Errorf("user %s has a password hash in the repository", u.Name)
		}
		if _, ok := d.PermissionsOf(u.Name, "/"); !ok {
			t.Errorf("user %s has no permissions in /", u.Name)
		}
		if admin := slices.Contains(u.Tags, "administrator"); admin != (u.Name == rabbitadmin.AdminUser) {
			t.Errorf("user %s: tags %v: only %s is an administrator", u.Name, u.Tags, rabbitadmin.AdminUser)
		}
		// make dev's password for it is refused outside development.
		if !config.DevelopmentCredential(rabbitadmin.DevPassword(u.Name)) {
			t.Errorf("user %s: make dev's password %q is not refused outside development (config.DevelopmentCredential)", u.Name, rabbitadmin.DevPassword(u.Name))
		}
	}
	if len(d.Permissions) != len(d.Users) {
		t.Errorf("%d permissions for %d users: one each, in /", len(d.Permissions), len(d.Users))
	}
	if _, err := rabbitadmin.ReadDefinitions(filepath.Join(root, rabbitadmin.DefinitionsFile), filepath.Join(root, rabbitadmin.DefinitionsFile)); err == nil {
		t.Error("the same users read twice: no error")
	}
}
