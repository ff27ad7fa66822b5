package testenv

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	tcrabbitmq "github.com/testcontainers/testcontainers-go/modules/rabbitmq"

	"github.com/yourorg/orders/internal/rabbitadmin"
)

const (
	defaultAMQPURL  = "amqp://guest:guest@127.0.0.1:5672/"
	rabbitmqImage   = "rabbitmq:3.10-management-alpine"
	testVhostPrefix = "orders_test_"
)

var broker struct {
	once sync.Once
	url  *url.URL // AMQP URL of the server, vhost "/"
	// admin creates and deletes the tests' vhosts and users: through the
	// management HTTP API when there is one, else with rabbitmqctl on this
	// machine.
	admin rabbitadmin.Admin
	err   error
}

// NewVhost creates a RabbitMQ virtual host for t and returns an AMQP URL
// that connects to it. Exchanges and queues in it are t's alone; the vhost
// and everything in it is deleted when t ends.
func NewVhost(t testing.TB) string {
	t.Helper()
	needsServers(t, "RabbitMQ")
	ctx := context.Background()
	broker.once.Do(func() { broker.url, broker.admin, broker.err = prepareRabbitMQ(ctx) })
	if broker.err != nil {
		t.Fatalf("testenv: RabbitMQ: %v", broker.err)
	}
	vhost := testVhostPrefix + strconv.FormatInt(time.Now().Unix(), 10) + "_" + randomSuffix()
	user := broker.url.User.Username()
	if err := broker.admin.AddVhost(ctx, vhost); err != nil {
		t.Fatalf("testenv: create vhost: %v", err)
	}
	t.Cleanup(func() {
		if err := broker.admin.DeleteVhost(context.Background(), vhost); err != nil {
			t.Errorf("testenv: delete vhost %s: %v", vhost, err)
		}
	})
	if err := broker.admin.SetPermissions(ctx, vhost, user, rabbitadmin.All); err != nil {
		t.Fatalf("testenv: give %s the vhost: %v", user, err)
	}
	u := *broker.url
	u.Path = "/" + vhost
	return u.String()
}

func prepareRabbitMQ(ctx context.Context) (*url.URL, rabbitadmin.Admin, error) {
	raw := os.Getenv("AMQP_URL")
	explicit := raw != ""
	if !explicit {
		raw = defaultAMQPURL
	}
	u, err := url.Parse(raw)
	if err != nil {
		return nil, nil, fmt.Errorf("AMQP_URL: %w", err)
	}
	u.Path = "/"
	var admin rabbitadmin.Admin
	if err := pingRabbitMQ(u.String()); err != nil {
		if explicit {
			return nil, nil, fmt.Errorf("AMQP_URL is set but the broker does not answer: %w", err)
		}
		u, admin, err = startRabbitMQContainer(ctx)
		if err != nil {
			return nil, nil, err
		}
	} else {
		admin = rabbitadmin.Local(ctx, u)
	}
	dropBrokerLeftovers(ctx, admin)
	return u, admin, nil
}

func pingRabbitMQ(amqpURL string) error {
	conn, err := amqp.DialConfig(amqpURL, amqp.Config{Dial: amqp.DefaultDial(3 * time.Second)})
	if err != nil {
		return err
	}
	return conn.Close()
}

func startRabbitMQContainer(ctx context.Context) (*url.URL, rabbitadmin.Admin, error) {
	ctr, err := tcrabbitmq.Run(ctx, rabbitmqImage)
	if err != nil {
		return nil, nil, fmt.Errorf("no RabbitMQ answers at %s, and starting one with testcontainers failed: %w", defaultAMQPURL, err)
	}
	amqpURL, err := ctr.AmqpURL(ctx)
	if err != nil {
		return nil, nil, err
	}
	httpURL, err := ctr.HttpURL(ctx)
	if err != nil {
		return nil, nil, err
	}
	u, err := url.Parse(amqpURL)
	if err != nil {
		return nil, nil, err
	}
	m, err := url.Parse(httpURL)
	if err != nil {
		return nil, nil, err
	}
	m.User = url.UserPassword(ctr.AdminUsername, ctr.AdminPassword)
	u.Path = "/"
	return u, &rabbitadmin.ManagementAPI{Base: m}, nil
}

// dropBrokerLeftovers deletes the test vhosts and users of runs killed before
// their cleanup (older than an hour).
func dropBrokerLeftovers(ctx context.Context, admin rabbitadmin.Admin) {
	cutoff := time.Now().Add(-time.Hour).Unix()
	old := func(name string) bool {
		created, _, _ := strings.Cut(strings.TrimPrefix(name, testVhostPrefix), "_")
		ts, err := strconv.ParseInt(created, 10, 64)
		return strings.HasPrefix(name, testVhostPrefix) && err == nil && ts < cutoff
	}
	if names, err := admin.Vhosts(ctx); err == nil {
		for _, name := range names {
			if old(name) {
				_ = admin.DeleteVhost(ctx, name)
			}
		}
	}
	if names, err := admin.Users(ctx); err == nil {
		for _, name := range names {
			if old(name) {
				_ = admin.DeleteUser(ctx, name)
			}
		}
	}
}

// BrokerUserPrefix returns a prefix of RabbitMQ user names unique to t.
// Users are the broker's, not a vhost's: a test that creates users (itself,
// or through a process it runs: scripts/dev.sh's DEV_AMQP_USER_PREFIX)
// names them with it, and deletes them with DeleteBrokerUsers. Users of a
// killed run are deleted by a later run, after an hour.
func BrokerUserPrefix(t testing.TB) string {
	t.Helper()
	return testVhostPrefix + strconv.FormatInt(time.Now().Unix(), 10) + "_" + randomSuffix() + "_"
}

// NewBrokerUser creates a RabbitMQ user for t (its name is name after a
// prefix unique to t) with permissions p in the vhost of vhostURL (a
// NewVhost URL), and topic permissions topics there, and returns vhostURL
// logged in as that user, whose password is its name. The user is deleted
// when t ends.
func NewBrokerUser(t testing.TB, vhostURL, name string, p rabbitadmin.Permissions, topics ...rabbitadmin.TopicPermissions) string {
	t.Helper()
	u, err := url.Parse(vhostURL)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	user := BrokerUserPrefix(t) + name
	ctx := context.Background()
	if err := broker.admin.PutUser(ctx, user, user); err != nil {
		t.Fatalf("testenv: create RabbitMQ user: %v", err)
	}
	DeleteBrokerUsers(t, user)
	if err := broker.admin.SetPermissions(ctx, strings.TrimPrefix(u.Path, "/"), user, p); err != nil {
		t.Fatalf("testenv: permissions of RabbitMQ user %s: %v", user, err)
	}
	for _, tp := range topics {
		if err := broker.admin.SetTopicPermissions(ctx, strings.TrimPrefix(u.Path, "/"), user, tp); err != nil {
			t.Fatalf("testenv: topic permissions of RabbitMQ user %s: %v", user, err)
		}
	}
	u.User = url.UserPassword(user, user)
	return u.String()
}

// BrokerAdmin is the administration of the tests' broker (NewVhost first).
func BrokerAdmin(t testing.TB) rabbitadmin.Admin {
	t.Helper()
	if broker.admin == nil {
		t.Fatal("testenv: BrokerAdmin before NewVhost")
	}
	return broker.admin
}

// DeleteBrokerUsers deletes the RabbitMQ users named when t ends (NewVhost
// first). A user already gone is not an error.
func DeleteBrokerUsers(t testing.TB, users ...string) {
	t.Helper()
	admin := BrokerAdmin(t)
	t.Cleanup(func() {
		ctx := context.Background()
		for _, user := range users {
			if err := admin.DeleteUser(ctx, user); err != nil {
				if existing, lerr := admin.Users(ctx); lerr == nil && !slices.Contains(existing, user) {
					continue // never created, or gone already
				}
				t.Errorf("testenv: delete RabbitMQ user %s: %v", user, err)
			}
		}
	})
}
