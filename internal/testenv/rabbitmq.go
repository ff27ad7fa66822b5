package testenv

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	tcrabbitmq "github.com/testcontainers/testcontainers-go/modules/rabbitmq"
)

const (
	defaultAMQPURL  = "amqp://guest:guest@127.0.0.1:5672/"
	rabbitmqImage   = "rabbitmq:3.10-management-alpine"
	testVhostPrefix = "orders_test_"
)

// vhostAdmin creates and deletes virtual hosts: through the management
// HTTP API when there is one, else with rabbitmqctl on this machine.
type vhostAdmin interface {
	add(ctx context.Context, vhost, user string) error
	remove(ctx context.Context, vhost string) error
	list(ctx context.Context) ([]string, error)
}

var broker struct {
	once  sync.Once
	url   *url.URL // AMQP URL of the server, vhost "/"
	admin vhostAdmin
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
	if err := broker.admin.add(ctx, vhost, user); err != nil {
		t.Fatalf("testenv: create vhost: %v", err)
	}
	t.Cleanup(func() {
		if err := broker.admin.remove(context.Background(), vhost); err != nil {
			t.Errorf("testenv: delete vhost %s: %v", vhost, err)
		}
	})
	u := *broker.url
	u.Path = "/" + vhost
	return u.String()
}

func prepareRabbitMQ(ctx context.Context) (*url.URL, vhostAdmin, error) {
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
	var admin vhostAdmin
	if err := pingRabbitMQ(u.String()); err != nil {
		if explicit {
			return nil, nil, fmt.Errorf("AMQP_URL is set but the broker does not answer: %w", err)
		}
		u, admin, err = startRabbitMQContainer(ctx)
		if err != nil {
			return nil, nil, err
		}
	} else {
		admin = localAdmin(ctx, u)
	}
	dropLeftoverVhosts(ctx, admin)
	return u, admin, nil
}

func pingRabbitMQ(amqpURL string) error {
	conn, err := amqp.DialConfig(amqpURL, amqp.Config{Dial: amqp.DefaultDial(3 * time.Second)})
	if err != nil {
		return err
	}
	return conn.Close()
}

// localAdmin prefers the management API next to the broker (what a
// RabbitMQ in Docker has), and falls back to rabbitmqctl (what a broker
// installed on this machine has).
func localAdmin(ctx context.Context, amqpURL *url.URL) vhostAdmin {
	mgmt := os.Getenv("RABBITMQ_MANAGEMENT_URL")
	if mgmt == "" {
		mgmt = "http://" + amqpURL.Hostname() + ":15672"
	}
	m, err := url.Parse(mgmt)
	if err == nil {
		if m.User == nil {
			m.User = amqpURL.User
		}
		api := &managementAPI{base: m}
		if _, err := api.list(ctx); err == nil {
			return api
		}
	}
	return rabbitmqctl{}
}

func startRabbitMQContainer(ctx context.Context) (*url.URL, vhostAdmin, error) {
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
	return u, &managementAPI{base: m}, nil
}

// dropLeftoverVhosts deletes the test vhosts of runs killed before their
// cleanup (older than an hour).
func dropLeftoverVhosts(ctx context.Context, admin vhostAdmin) {
	names, err := admin.list(ctx)
	if err != nil {
		return
	}
	cutoff := time.Now().Add(-time.Hour).Unix()
	for _, name := range names {
		created, _, _ := strings.Cut(strings.TrimPrefix(name, testVhostPrefix), "_")
		if ts, err := strconv.ParseInt(created, 10, 64); strings.HasPrefix(name, testVhostPrefix) && err == nil && ts < cutoff {
			_ = admin.remove(ctx, name)
		}
	}
}

type managementAPI struct{ base *url.URL }

func (m *managementAPI) do(ctx context.Context, method, path string, body any) ([]byte, error) {
	var payload []byte
	if body != nil {
		payload, _ = json.Marshal(body)
	}
	// The base URL's user and password become Basic authentication.
	req, err := http.NewRequestWithContext(ctx, method, m.base.String()+path, bytes.NewReader(payload))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var out bytes.Buffer
	_, _ = out.ReadFrom(resp.Body)
	if resp.StatusCode >= 300 {
		return nil, fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, out.String())
	}
	return out.Bytes(), nil
}

func (m *managementAPI) add(ctx context.Context, vhost, user string) error {
	if _, err := m.do(ctx, http.MethodPut, "/api/vhosts/"+url.PathEscape(vhost), nil); err != nil {
		return err
	}
	_, err := m.do(ctx, http.MethodPut, "/api/permissions/"+url.PathEscape(vhost)+"/"+url.PathEscape(user),
		map[string]string{"configure": ".*", "write": ".*", "read": ".*"})
	return err
}

func (m *managementAPI) remove(ctx context.Context, vhost string) error {
	_, err := m.do(ctx, http.MethodDelete, "/api/vhosts/"+url.PathEscape(vhost), nil)
	return err
}

func (m *managementAPI) list(ctx context.Context) ([]string, error) {
	body, err := m.do(ctx, http.MethodGet, "/api/vhosts", nil)
	if err != nil {
		return nil, err
	}
	var vhosts []struct {
		Name string `json:"name"`
	}
	if err := json.Unmarshal(body, &vhosts); err != nil {
		return nil, err
	}
	names := make([]string, len(vhosts))
	for i, v := range vhosts {
		names[i] = v.Name
	}
	return names, nil
}

type rabbitmqctl struct{}

func (rabbitmqctl) run(ctx context.Context, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, "rabbitmqctl", append([]string{"--quiet"}, args...)...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("rabbitmqctl %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

func (r rabbitmqctl) add(ctx context.Context, vhost, user string) error {
	if _, err := r.run(ctx, "add_vhost", vhost); err != nil {
		return err
	}
	_, err := r.run(ctx, "set_permissions", "-p", vhost, user, ".*", ".*", ".*")
	return err
}

func (r rabbitmqctl) remove(ctx context.Context, vhost string) error {
	_, err := r.run(ctx, "delete_vhost", vhost)
	return err
}

func (r rabbitmqctl) list(ctx context.Context) ([]string, error) {
	out, err := r.run(ctx, "list_vhosts", "--no-table-headers")
	if err != nil {
		return nil, err
	}
	return strings.Fields(out), nil
}
