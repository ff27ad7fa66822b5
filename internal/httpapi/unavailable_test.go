package httpapi_test

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/jackc/pgx/v5"

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
