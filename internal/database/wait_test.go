package database_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/testenv"
)

// A refusal that no wait can change ends NewPool at once, naming its
// cause, although the connect timeout would wait an hour. The local server
// trusts every login, so a wrong password (28P01) cannot be provoked here;
// a role and a database that do not exist are refused the same way. If
// NewPool retried, it would run into the test's own deadline and say the
// database is not reachable.
func TestNewPoolFailsAtOnceOnAPermanentRefusal(t *testing.T) {
	t.Parallel()
	suffix := strings.ReplaceAll(uuid.NewString(), "-", "")
	for _, tc := range []struct {
		name, url, code, cause string
	}{
		{"role does not exist", testenv.AsRole(testenv.ServerURL(t, "postgres"), "no_such_role_"+suffix), "28000", "role does not exist"},
		{"database does not exist", testenv.ServerURL(t, "no_such_db_"+suffix), "3D000", "database does not exist"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()
			pool, err := database.NewPool(ctx, database.PoolConfig{URL: tc.url, AppName: "refused", ConnectTimeout: time.Hour})
			if err == nil {
				pool.Close()
				t.Fatal("NewPool connected")
			}
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != tc.code {
				t.Fatalf("err = %v, want SQLSTATE %s in its chain", err, tc.code)
			}
			if msg := err.Error(); !strings.Contains(msg, "not retried") || !strings.Contains(msg, tc.cause) || strings.Contains(msg, "not reachable") {
				t.Errorf("err = %q, want it to say it was not retried and why (%s)", msg, tc.cause)
			}
			if ctx.Err() != nil {
				t.Errorf("NewPool returned only at the test's deadline: %v", err)
			}
		})
	}
}
