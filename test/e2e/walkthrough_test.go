package e2e

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/yourorg/orders/api/apicheck"
	"github.com/yourorg/orders/internal/rabbitadmin"
	"github.com/yourorg/orders/internal/testenv"
	"github.com/yourorg/orders/migrations"
)

// The guided walkthrough, unattended, against the system as make dev runs
// it (scripts/dev.sh: its supervisor restarts the consumer the walkthrough
// crashes), on this test's own database, virtual host and ports. Every
// step of the walkthrough checks its own evidence and exits 1 when the
// system does not behave as it says; then Ctrl-C (SIGINT to the process
// group, as a terminal sends it) must stop every process.
func TestWalkthroughAgainstMakeDev(t *testing.T) {
	t.Parallel()
	name := testenv.TestDatabaseName()
	testenv.DropDatabaseAtCleanup(t, name)
	dbURL, amqpURL := testenv.ServerURL(t, name), testenv.NewVhost(t) // first: under -short they skip, before the build
	// make dev creates the processes' RabbitMQ users, which are the
	// broker's, not the vhost's: under names of this test's own.
	userPrefix := testenv.BrokerUserPrefix(t)
	var users []string
	for _, u := range rabbitadmin.ProcessUsers {
		users = append(users, userPrefix+u)
	}
	testenv.DeleteBrokerUsers(t, users...)
	// loginAs is amqpURL logged in as one of them, with its dev password.
	loginAs := func(user string) string {
		u, err := url.Parse(amqpURL)
		if err != nil {
			t.Fatal(err)
		}
		u.User = url.UserPassword(userPrefix+user, rabbitadmin.DevPassword(user))
		return u.String()
	}

	root := testenv.RepoRoot(t)
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", bin+"/", "./lab/walkthrough", "./cmd/orderctl")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	addr := map[string]string{}
	for _, k := range []string{"DEV_API_ADDR", "DEV_RELAY1_ADDR", "DEV_RELAY2_ADDR", "DEV_CONSUMER_ADDR", "DEV_WEBHOOK_ADDR"} {
		addr[k] = testenv.FreeAddr(t)
	}

	dev := exec.Command("./scripts/dev.sh")
	dev.Dir = root
	// The API's secret, as .env would set it; the walkthrough's token is
	// minted with it by orderctl token, as a developer would.
	secret := "API_JWT_SECRET=" + rand.Text() + rand.Text()
	dev.Env = append(os.Environ(), "DATABASE_URL="+dbURL, "AMQP_URL="+amqpURL, "DEV_AMQP_USER_PREFIX="+userPrefix, "DEV_BIN="+bin, "LOG_FORMAT=json", secret,
		"DOTENV=none") // this test sets the environment; a .env of the checkout must not add to it
	for k, v := range addr {
		dev.Env = append(dev.Env, k+"="+v)
	}
	dev.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var mu sync.Mutex
	var devOut bytes.Buffer
	dev.Stdout = lockedWriter{&mu, &devOut}
	dev.Stderr = lockedWriter{&mu, &devOut}
	if err := dev.Start(); err != nil {
		t.Fatal(err)
	}
	devDone := make(chan error, 1)
	go func() { devDone <- dev.Wait() }()
	pgid := dev.Process.Pid
	t.Cleanup(func() {
		_ = syscall.Kill(-pgid, syscall.SIGKILL) // whatever is left after a failure
		if t.Failed() {
			mu.Lock()
			t.Logf("--- make dev output (last 8 KiB):\n%s", tail(devOut.String(), 8192))
			mu.Unlock()
		}
	})
	devOutput := func() string {
		mu.Lock()
		defer mu.Unlock()
		return devOut.String()
	}
	testenv.WaitFor(t, 2*time.Minute, "make dev to be ready", func() bool {
		select {
		case err := <-devDone:
			t.Fatalf("make dev exited: %v", err)
		default:
		}
		return strings.Contains(devOutput(), "[dev] running") &&
			isReady("http://"+addr["DEV_API_ADDR"]+"/readyz") && isReady("http://"+addr["DEV_CONSUMER_ADDR"]+"/readyz") &&
			isReady("http://"+addr["DEV_RELAY1_ADDR"]+"/readyz") && isReady("http://"+addr["DEV_RELAY2_ADDR"]+"/readyz") &&
			isReady("http://"+addr["DEV_WEBHOOK_ADDR"]+"/healthz")
	})

	mint := exec.Command(filepath.Join(bin, "orderctl"), "token", "-operator")
	mint.Env = append(os.Environ(), secret, "ORDERCTL_USER=e2e")
	token, err := mint.Output()
	if err != nil {
		t.Fatalf("orderctl token -operator: %v", err)
	}
	walk := exec.Command(filepath.Join(bin, "walkthrough"), "-yes", "-timeout", "60s")
	// The walkthrough and orderctl connect as the operators' role, as make
	// walkthrough and make ctl run them; make dev's processes as theirs.
	operatorURL := testenv.AsRole(dbURL, migrations.RoleOperator)
	// Its requests to order-api go through a proxy that checks them, and
	// the answers, against api/openapi.yaml.
	walk.Env = append(os.Environ(), "DATABASE_URL="+operatorURL, "AMQP_URL="+loginAs(rabbitadmin.WalkthroughUser), "API_JWT_SECRET=", "API_TOKEN="+strings.TrimSpace(string(token)),
		"API_URL="+apicheck.Proxy(t, "http://"+addr["DEV_API_ADDR"]), "CONSUMER_ADMIN_URL=http://"+addr["DEV_CONSUMER_ADDR"],
		"WEBHOOK_RECEIVER_URL=http://"+addr["DEV_WEBHOOK_ADDR"])
	out, err := walk.CombinedOutput()
	if err != nil {
		t.Fatalf("walkthrough -yes: %v\n%s", err, out)
	}
	for _, want := range []string{"Step 5 of 5", "Done: every step behaved", "order-consumer went down and came back"} {
		if !bytes.Contains(out, []byte(want)) {
			t.Errorf("the walkthrough's output lacks %q:\n%s", want, out)
		}
	}
	// The crash was real: the supervisor saw the consumer exit with code 3.
	if !strings.Contains(devOutput(), "[dev] consumer exited (3)") {
		t.Errorf("make dev never restarted the consumer after an exit with code 3")
	}

	// orderctl sees what the walkthrough did: its first order, whole, and
	// the poison message of step 4 in the parking lots.
	ctl := func(args ...string) []byte {
		t.Helper()
		cmd := exec.Command(filepath.Join(bin, "orderctl"), append(args, "--json")...)
		// As make ctl runs it: in development (scripts/env.sh), where the
		// development password of its RabbitMQ user is taken.
		cmd.Env = append(os.Environ(), "DATABASE_URL="+operatorURL, "AMQP_URL="+loginAs(rabbitadmin.OperatorUser), "ORDERCTL_USER=e2e",
			"DEV_MODE=true")
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("orderctl %v: %v\n%s", args, err, out)
		}
		return out
	}
	var status struct{ Next []string }
	if err := json.Unmarshal(ctl("status"), &status); err != nil || !slices.Contains(status.Next, "orderctl parked list fulfillment") {
		t.Errorf("orderctl status: %+v, %v", status, err)
	}
	db, err := pgx.Connect(t.Context(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	var first string
	err = db.QueryRow(t.Context(), `SELECT order_id::text FROM orders ORDER BY created_at LIMIT 1`).Scan(&first)
	_ = db.Close(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var timeline struct {
		Status   string
		History  []json.RawMessage
		TraceIDs []string `json:"trace_ids"`
	}
	if err := json.Unmarshal(ctl("order", first), &timeline); err != nil || timeline.Status != "FULFILLED" || len(timeline.History) != 3 {
		t.Errorf("orderctl order %s: %+v, %v", first, timeline, err)
	}

	// make dev's processes are connected as their roles, not as
	// DATABASE_URL's user.
	admin, err := pgx.Connect(t.Context(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	rows, err := admin.Query(t.Context(), `SELECT DISTINCT application_name || ' as ' || usename FROM pg_stat_activity
		WHERE datname = $1 AND application_name IN ('order-api', 'outbox-relay', 'order-consumer') ORDER BY 1`, name)
	if err != nil {
		t.Fatal(err)
	}
	sessions, err := pgx.CollectRows(rows, pgx.RowTo[string])
	_ = admin.Close(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"order-api as orders_api", "order-consumer as orders_consumer", "outbox-relay as orders_relay"}; !slices.Equal(sessions, want) {
		t.Errorf("make dev's sessions: %q, want %q", sessions, want)
	}

	// Ctrl-C: every process shuts down gracefully and make dev exits.
	if err := syscall.Kill(-pgid, syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-devDone:
		var exit *exec.ExitError
		if err != nil && !errors.As(err, &exit) {
			t.Fatalf("make dev: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("make dev did not stop within 30s of Ctrl-C")
	}
	if !strings.Contains(devOutput(), "[dev] stopped") {
		t.Errorf("make dev did not report that it stopped")
	}
	// Nothing of the group runs on: kill(-pgid, 0) finds no process.
	testenv.WaitFor(t, 10*time.Second, "every process of make dev to exit", func() bool {
		return errors.Is(syscall.Kill(-pgid, 0), syscall.ESRCH)
	})
	for _, proc := range []string{"api", "relay-1", "relay-2", "consumer", "webhook"} {
		if !loggedStopped(devOutput(), proc) {
			t.Errorf("%s did not log a graceful stop", proc)
		}
	}
}

// loggedStopped reports whether process proc logged its "stopped" line.
func loggedStopped(out, proc string) bool {
	for line := range strings.SplitSeq(out, "\n") {
		if strings.HasPrefix(line, "["+proc+"] ") && strings.Contains(line, `"msg":"stopped"`) {
			return true
		}
	}
	return false
}

func isReady(url string) bool {
	resp, err := readyClient.Get(url)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == 200
}

var readyClient = &http.Client{Timeout: 2 * time.Second}
