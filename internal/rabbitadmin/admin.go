package rabbitadmin

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strings"
)

// Admin creates and deletes vhosts and users, and sets permissions. Users
// are the broker's (cluster-wide); permissions are a user's in one vhost.
type Admin interface {
	AddVhost(ctx context.Context, vhost string) error
	DeleteVhost(ctx context.Context, vhost string) error
	Vhosts(ctx context.Context) ([]string, error)
	// PutUser creates user, or changes its password and tags if it exists.
	PutUser(ctx context.Context, user, password string, tags ...string) error
	DeleteUser(ctx context.Context, user string) error
	Users(ctx context.Context) ([]string, error)
	SetPermissions(ctx context.Context, vhost, user string, p Permissions) error
	SetTopicPermissions(ctx context.Context, vhost, user string, p TopicPermissions) error
}

// Local returns the administration of the broker of amqpURL, logged in as
// amqpURL's user: its management API (RABBITMQ_MANAGEMENT_URL, else port
// 15672 of the same host), what a RabbitMQ in Docker has, when it answers;
// else rabbitmqctl, what a broker installed on this machine has.
func Local(ctx context.Context, amqpURL *url.URL) Admin {
	mgmt := os.Getenv("RABBITMQ_MANAGEMENT_URL")
	if mgmt == "" {
		mgmt = "http://" + amqpURL.Hostname() + ":15672"
	}
	m, err := url.Parse(mgmt)
	if err == nil {
		if m.User == nil {
			m.User = amqpURL.User
		}
		api := &ManagementAPI{Base: m}
		if _, err := api.Vhosts(ctx); err == nil {
			return api
		}
	}
	return Rabbitmqctl{}
}

// ManagementAPI is the management plugin's HTTP API at Base, whose user
// and password are the login.
type ManagementAPI struct{ Base *url.URL }

func (m *ManagementAPI) do(ctx context.Context, method, path string, body any) ([]byte, error) {
	var payload []byte
	if body != nil {
		payload, _ = json.Marshal(body)
	}
	// The base URL's user and password become Basic authentication.
	req, err := http.NewRequestWithContext(ctx, method, m.Base.String()+path, bytes.NewReader(payload))
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

func (m *ManagementAPI) names(ctx context.Context, path string) ([]string, error) {
	body, err := m.do(ctx, http.MethodGet, path, nil)
	if err != nil {
		return nil, err
	}
	var items []struct {
		Name string `json:"name"`
	}
	if err := json.Unmarshal(body, &items); err != nil {
		return nil, fmt.Errorf("GET %s: %w", path, err)
	}
	names := make([]string, len(items))
	for i, v := range items {
		names[i] = v.Name
	}
	return names, nil
}

func (m *ManagementAPI) AddVhost(ctx context.Context, vhost string) error {
	_, err := m.do(ctx, http.MethodPut, "/api/vhosts/"+url.PathEscape(vhost), nil)
	return err
}

func (m *ManagementAPI) DeleteVhost(ctx context.Context, vhost string) error {
	_, err := m.do(ctx, http.MethodDelete, "/api/vhosts/"+url.PathEscape(vhost), nil)
	return err
}

func (m *ManagementAPI) Vhosts(ctx context.Context) ([]string, error) {
	return m.names(ctx, "/api/vhosts")
}

func (m *ManagementAPI) PutUser(ctx context.Context, user, password string, tags ...string) error {
	// Tags as one comma-separated string: what every 3.x accepts.
	_, err := m.do(ctx, http.MethodPut, "/api/users/"+url.PathEscape(user),
		map[string]string{"password": password, "tags": strings.Join(tags, ",")})
	return err
}

func (m *ManagementAPI) DeleteUser(ctx context.Context, user string) error {
	_, err := m.do(ctx, http.MethodDelete, "/api/users/"+url.PathEscape(user), nil)
	return err
}

func (m *ManagementAPI) Users(ctx context.Context) ([]string, error) {
	return m.names(ctx, "/api/users")
}

func (m *ManagementAPI) SetPermissions(ctx context.Context, vhost, user string, p Permissions) error {
	_, err := m.do(ctx, http.MethodPut, "/api/permissions/"+url.PathEscape(vhost)+"/"+url.PathEscape(user), p)
	return err
}

func (m *ManagementAPI) SetTopicPermissions(ctx context.Context, vhost, user string, p TopicPermissions) error {
	_, err := m.do(ctx, http.MethodPut, "/api/topic-permissions/"+url.PathEscape(vhost)+"/"+url.PathEscape(user), p)
	return err
}

// Rabbitmqctl is rabbitmqctl on this machine, talking to the local node.
type Rabbitmqctl struct{}

func (Rabbitmqctl) run(ctx context.Context, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, "rabbitmqctl", append([]string{"--quiet"}, args...)...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("rabbitmqctl %s: %w: %s", args[0], err, out) // args[0]: never a password
	}
	return string(out), nil
}

func (r Rabbitmqctl) AddVhost(ctx context.Context, vhost string) error {
	_, err := r.run(ctx, "add_vhost", vhost)
	return err
}

func (r Rabbitmqctl) DeleteVhost(ctx context.Context, vhost string) error {
	_, err := r.run(ctx, "delete_vhost", vhost)
	return err
}

func (r Rabbitmqctl) Vhosts(ctx context.Context) ([]string, error) {
	out, err := r.run(ctx, "list_vhosts", "--no-table-headers")
	if err != nil {
		return nil, err
	}
	return strings.Fields(out), nil
}

func (r Rabbitmqctl) PutUser(ctx context.Context, user, password string, tags ...string) error {
	_, err := r.run(ctx, "add_user", user, password)
	switch {
	case err != nil && strings.Contains(err.Error(), "already exists"):
		if _, err := r.run(ctx, "change_password", user, password); err != nil {
			return err
		}
	case err != nil:
		return err
	case len(tags) == 0:
		return nil // a new user has none
	}
	_, err = r.run(ctx, append([]string{"set_user_tags", user}, tags...)...)
	return err
}

func (r Rabbitmqctl) DeleteUser(ctx context.Context, user string) error {
	_, err := r.run(ctx, "delete_user", user)
	return err
}

func (r Rabbitmqctl) Users(ctx context.Context) ([]string, error) {
	out, err := r.run(ctx, "list_users", "--no-table-headers")
	if err != nil {
		return nil, err
	}
	var users []string
	for line := range strings.Lines(out) {
		if name, _, _ := strings.Cut(strings.TrimRight(line, "\n"), "\t"); name != "" {
			users = append(users, name)
		}
	}
	return users, nil
}

func (r Rabbitmqctl) SetPermissions(ctx context.Context, vhost, user string, p Permissions) error {
	_, err := r.run(ctx, "set_permissions", "-p", vhost, user, p.Configure, p.Write, p.Read)
	return err
}

func (r Rabbitmqctl) SetTopicPermissions(ctx context.Context, vhost, user string, p TopicPermissions) error {
	_, err := r.run(ctx, "set_topic_permissions", "-p", vhost, user, p.Exchange, p.Write, p.Read)
	return err
}
