package httpapi_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/yourorg/orders/internal/auth"
	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/httpapi"
	"github.com/yourorg/orders/internal/testenv"
	"github.com/yourorg/orders/migrations"
)

// The API's benchmark (docs/benchmarks.md):
//
//	go test -run '^$' -bench . -benchtime 1x ./internal/httpapi/

const (
	benchOrders      = 3000
	benchConcurrency = 8
)

// BenchmarkCreateOrder measures POST /v1/orders through HTTP on loopback:
// 8 clients, each posting its next order as soon as the last one is
// answered (201), against order-api's handler as the binary builds it
// (bearer token verified, JSON logs of every request, metrics, its own
// role's pool of 10 connections, no tracing exporter). The baseline, in
// the same rounds, is a raw pgx loop at the same concurrency doing
// BEGIN; INSERT order; INSERT outbox row; COMMIT with no HTTP at all. It
// reports both rates and their ratio (median of 3 rounds, alternated, each
// on a database of its own).
func BenchmarkCreateOrder(b *testing.B) {
	var apiRates, rawRates []float64
	for range 3 {
		rawRates = append(rawRates, rawCreateLoop(b))
		apiRates = append(apiRates, apiCreateLoop(b))
	}
	api, raw := benchMedian(apiRates), benchMedian(rawRates)
	b.ReportMetric(api, "api-orders/s")
	b.ReportMetric(raw, "raw-tx/s")
	b.ReportMetric(api/raw, "ratio")
	b.Logf("POST /v1/orders %.0f orders/s, raw pgx loop %.0f tx/s: ratio %.2f (rounds: api %.0f, raw %.0f; %d at a time)",
		api, raw, api/raw, apiRates, rawRates, benchConcurrency)
}

// apiCreateLoop posts benchOrders orders, benchConcurrency at a time, and
// returns the rate.
func apiCreateLoop(b *testing.B) float64 {
	db := testenv.NewDatabase(b, migrations.Schemas...)
	pool, err := database.NewPool(b.Context(), database.PoolConfig{URL: db.URLAs(migrations.RoleAPI), MaxConns: 10})
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	secret := []byte(rand.Text() + rand.Text())
	verifier, err := auth.NewVerifier(auth.Options{Secret: secret})
	if err != nil {
		b.Fatal(err)
	}
	handler, err := httpapi.New(httpapi.Config{IdempotencyKeyTTL: time.Hour}, httpapi.Deps{
		Verifier:       verifier,
		Pool:           pool,
		Logger:         slog.New(slog.NewJSONHandler(io.Discard, nil)),
		TracerProvider: tracenoop.NewTracerProvider(),
		MeterProvider:  testenv.NewMetrics().Provider,
		MetricsHandler: http.NotFoundHandler(),
	})
	if err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewServer(handler)
	defer srv.Close()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: benchConcurrency}, Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()

	bodies := make([][]byte, benchConcurrency)
	tokens := make([]string, benchConcurrency)
	for i := range benchConcurrency {
		customer := fmt.Sprintf("bench-%d", i)
		bodies[i], _ = json.Marshal(map[string]any{"customer_id": customer, "currency": "EUR",
			"items": []map[string]any{{"sku": "A-1", "quantity": 2, "unit_price_cents": 1250}}})
		if tokens[i], err = auth.Mint(secret, auth.Principal{Subject: customer}, time.Hour, "", ""); err != nil {
			b.Fatal(err)
		}
	}
	return concurrently(b, func(worker int) error {
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/orders", bytes.NewReader(bodies[worker]))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+tokens[worker])
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			return err
		}
		if resp.StatusCode != http.StatusCreated {
			return fmt.Errorf("POST /v1/orders: %s", resp.Status)
		}
		return nil
	})
}

// rawCreateLoop writes benchOrders orders with their outbox rows straight
// through pgx, benchConcurrency transactions at a time, and returns the
// rate.
func rawCreateLoop(b *testing.B) float64 {
	db := testenv.NewDatabase(b, migrations.Schemas...)
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = 10 // the API's pool's size
	pool, err := pgxpool.NewWithConfig(b.Context(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	payload := []byte(`{"order_id":"x","customer_id":"raw","currency":"EUR","total_cents":2500,"items":[{"sku":"A-1","quantity":2,"unit_price_cents":1250}]}`)
	return concurrently(b, func(int) error {
		id := uuid.Must(uuid.NewV7())
		return pgx.BeginFunc(b.Context(), pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(b.Context(), `INSERT INTO orders (order_id, customer_id, currency, status, version, total_cents)
				VALUES ($1, 'raw', 'EUR', 'SUBMITTED', 1, 2500)`, id); err != nil {
				return err
			}
			_, err := tx.Exec(b.Context(), `INSERT INTO message_outbox (outbox_id, aggregate_type, aggregate_id, message_type,
				message_version, exchange_name, routing_key, payload, headers)
				VALUES ($1, 'order', $2, 'order.submitted', 1, 'orders.events', 'order.submitted', $3, '{}')`,
				uuid.Must(uuid.NewV7()), id.String(), payload)
			return err
		})
	})
}

// concurrently runs do benchOrders times, benchConcurrency at a time, and
// returns the rate; the first error fails the benchmark.
func concurrently(b *testing.B, do func(worker int) error) float64 {
	var (
		next     atomic.Int64
		wg       sync.WaitGroup
		firstErr error
		once     sync.Once
	)
	ctx, cancel := context.WithCancel(b.Context())
	defer cancel()
	start := time.Now()
	for w := range benchConcurrency {
		wg.Go(func() {
			for ctx.Err() == nil && next.Add(1) <= benchOrders {
				if err := do(w); err != nil {
					once.Do(func() { firstErr = err; cancel() })
				}
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		b.Fatal(firstErr)
	}
	return benchOrders / time.Since(start).Seconds()
}

func benchMedian(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}
