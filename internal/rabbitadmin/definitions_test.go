package rabbitadmin_test

import (
	"path/filepath"
	"slices"
	"testing"

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

// TestDefinitionsFile checks the file compose's broker imports: every
// user has its dev password (what make dev, the compose file's URLs and
// the documentation use), RabbitMQ's default hashing, and permissions in
// the one vhost; there is no guest, and one administrator.
func TestDefinitionsFile(t *testing.T) {
	t.Parallel()
	d, err := rabbitadmin.ReadDefinitions(filepath.Join(testenv.RepoRoot(t), rabbitadmin.DefinitionsFile))
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Vhosts) != 1 || d.Vhosts[0].Name != "/" {
		t.Errorf("vhosts %v, want just /", d.Vhosts)
	}
	want := append([]string{rabbitadmin.AdminUser}, rabbitadmin.ProcessUsers...)
	var names []string
	for _, u := range d.Users {
		names = append(names, u.Name)
		if u.HashingAlgorithm != rabbitadmin.HashingAlgorithm {
			t.Errorf("user %s: hashing_algorithm %q, want %s", u.Name, u.HashingAlgorithm, rabbitadmin.HashingAlgorithm)
		}
		if ok, err := rabbitadmin.CheckPassword(u.PasswordHash, rabbitadmin.DevPassword(u.Name)); !ok || err != nil {
			t.Errorf("user %s: password_hash is not of its dev password %q (%v)", u.Name, rabbitadmin.DevPassword(u.Name), err)
		}
		if _, ok := d.PermissionsOf(u.Name, "/"); !ok {
			t.Errorf("user %s has no permissions in /", u.Name)
		}
		if admin := slices.Contains(u.Tags, "administrator"); admin != (u.Name == rabbitadmin.AdminUser) {
			t.Errorf("user %s: tags %v: only %s is an administrator", u.Name, u.Tags, rabbitadmin.AdminUser)
		}
	}
	slices.Sort(names)
	slices.Sort(want)
	if !slices.Equal(names, want) {
		t.Errorf("users %v, want %v", names, want)
	}
	if len(d.Permissions) != len(d.Users) {
		t.Errorf("%d permissions for %d users: one each, in /", len(d.Permissions), len(d.Users))
	}
}
