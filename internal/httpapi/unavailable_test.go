package httpapi_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/httpapi"
	"github.com/yourorg/orders/internal/testenv"
)

// A database that takes no writes (a read-only standby after a failover)
// is not the request's fault and not a bug: the API answers 503
// database_unavailable with Retry-After, writes nothing, and works again
// once the database does.
func TestReadOnlyDatabaseAnswers503(t *testing.T) {
	t.Parallel()
	b := setup(t)
	db := b.pool.Config().ConnConfig.Database
	admin, err := pgx.Connect(t.Context(), testenv.ServerURL(t, "postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(t.Context())
	readOnly := func(on bool) {
		t.Helper()
		if _, err := admin.Exec(t.Context(), fmt.Sprintf("ALTER DATABASE %s SET default_transaction_read_only = %v", db, on)); err != nil {
			t.Fatal(err)
		}
		b.api.Reset() // new sessions pick the setting up
	}
	readOnly(true)
	r := b.do(http.MethodPost, "/v1/orders", []byte(validOrder), nil)
	if r.status != http.StatusServiceUnavailable || r.problem(t).Code != "database_unavailable" || r.header.Get("Retry-After") == "" {
		t.Fatalf("read-only database: %d %s (Retry-After %q), want 503 database_unavailable", r.status, r.body, r.header.Get("Retry-After"))
	}
	readOnly(false)
	var orders int
	if err := b.pool.QueryRow(t.Context(), "SELECT count(*) FROM orders").Scan(&orders); err != nil || orders != 0 {
		t.Fatalf("%d orders written (%v) while the database was read-only", orders, err)
	}
	if r := b.do(http.MethodPost, "/v1/orders", []byte(validOrder), nil); r.status != http.StatusCreated {
		t.Fatalf("after the database is writable again: %d %s", r.status, r.body)
	}
}

// Any error the database gives a request's transaction is answered 503
// with Retry-After, never 500: the transaction rolled back, and the request
// may work when retried: a lock wait past the pool's lock timeout, an
// error the server raises for its own reasons (here a trigger).
func TestDatabaseErrorAnswers503(t *testing.T) {
	t.Parallel()
	b := setupWith(t, func(_ *httpapi.Config, deps *httpapi.Deps) {
		pool, err := database.NewPool(t.Context(), database.PoolConfig{URL: deps.Pool.Config().ConnString(), LockTimeout: 100 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		deps.Pool = pool
	})
	r := b.do(http.MethodPost, "/v1/orders", []byte(validOrder), nil)
	if r.status != http.StatusCreated {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	var order struct {
		OrderID string `json:"order_id"`
	}
	r.decode(t, &order)

	holder, err := b.pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Rollback(t.Context()) }()
	if _, err := holder.Exec(t.Context(), "SELECT FROM orders WHERE order_id = $1 FOR UPDATE", order.OrderID); err != nil {
		t.Fatal(err)
	}
	r = b.do(http.MethodPost, "/v1/orders/"+order.OrderID+"/cancel", nil, nil)
	if r.status != http.StatusServiceUnavailable || r.problem(t).Code != "database_error" || r.header.Get("Retry-After") == "" {
		t.Errorf("cancel of a locked order: %d %s (Retry-After %q), want 503 database_error", r.status, r.body, r.header.Get("Retry-After"))
	}
	_ = holder.Rollback(t.Context())

	if _, err := b.pool.Exec(t.Context(), `
		CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'refused'; END $$;
		CREATE TRIGGER refuse BEFORE INSERT ON orders FOR EACH ROW EXECUTE FUNCTION refuse()`); err != nil {
		t.Fatal(err)
	}
	r = b.do(http.MethodPost, "/v1/orders", []byte(validOrder), nil)
	if r.status != http.StatusServiceUnavailable || r.problem(t).Code != "database_error" || r.header.Get("Retry-After") == "" {
		t.Errorf("create refused by the database: %d %s (Retry-After %q), want 503 database_error", r.status, r.body, r.header.Get("Retry-After"))
	}
}
