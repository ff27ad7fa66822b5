package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// closedSummary is what a closed-loop run (-closed) prints as JSON.
type closedSummary struct {
	Mode        string         `json:"mode"` // "api" or "raw"
	Concurrency int            `json:"concurrency"`
	Orders      int            `json:"orders"` // written (201, or committed)
	Errors      map[string]int `json:"errors"` // by status code, or the error
	Seconds     float64        `json:"seconds"`
	Rate        float64        `json:"rate"` // orders per second
}

// runClosed writes cfg.orders orders, cfg.closed at a time, each client
// sending its next as soon as its last is answered: through the API, a
// POST /v1/orders with an Idempotency-Key of its own, or, with
// -raw-database, straight to the database (BEGIN; INSERT order; INSERT
// outbox row; COMMIT), the floor the API's rate is held against.
func runClosed(ctx context.Context, cfg config, stdout io.Writer) error {
	s := closedSummary{Mode: "api", Concurrency: cfg.closed, Errors: map[string]int{}}
	var write func(ctx context.Context) (string, error)
	if cfg.rawDatabase != "" {
		s.Mode = "raw"
		pcfg, err := pgxpool.ParseConfig(cfg.rawDatabase)
		if err != nil {
			return fmt.Errorf("-raw-database: %w", err)
		}
		pcfg.MaxConns = int32(cfg.closed)
		pool, err := pgxpool.NewWithConfig(ctx, pcfg)
		if err != nil {
			return err
		}
		defer pool.Close()
		write = func(ctx context.Context) (string, error) { return rawOrder(ctx, pool) }
	} else {
		transport := http.DefaultTransport.(*http.Transport).Clone()
		transport.MaxIdleConnsPerHost = cfg.closed
		client := &http.Client{Transport: transport, Timeout: 30 * time.Second}
		defer client.CloseIdleConnections()
		write = func(ctx context.Context) (string, error) { return postOrder(ctx, client, cfg.api, cfg.token) }
	}
	var (
		next, done atomic.Int64
		mu         sync.Mutex
		wg         sync.WaitGroup
	)
	start := time.Now()
	for range cfg.closed {
		wg.Go(func() {
			for ctx.Err() == nil && next.Add(1) <= int64(cfg.orders) {
				failure, err := write(ctx)
				if err == nil && failure == "" {
					done.Add(1)
					continue
				}
				if err != nil {
					failure = err.Error()
				}
				mu.Lock()
				s.Errors[failure]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	s.Seconds = time.Since(start).Seconds()
	s.Orders = int(done.Load())
	s.Rate = float64(s.Orders) / s.Seconds
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(s); err != nil {
		return err
	}
	switch {
	case ctx.Err() != nil:
		return errors.New("interrupted")
	case s.Orders < cfg.orders:
		return fmt.Errorf("%d of %d orders were not written", cfg.orders-s.Orders, cfg.orders)
	}
	return nil
}

// postOrder posts one order with a new Idempotency-Key and returns its
// failure ("" for a 201).
func postOrder(ctx context.Context, client *http.Client, api, token string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, api+"/v1/orders", bytes.NewReader(orderBody))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", uuid.NewString())
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := client.Do(req)
	if err != nil {
		return "no response", nil
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return "no response", nil
	}
	if resp.StatusCode != http.StatusCreated {
		return strconv.Itoa(resp.StatusCode), nil
	}
	return "", nil
}

// rawPayload is the outbox row's payload of the raw loop: the size of the
// API's order.submitted.
var rawPayload = []byte(`{"order_id":"x","customer_id":"raw","currency":"EUR","total_cents":2500,"items":[{"sku":"A-1","quantity":2,"unit_price_cents":1250}]}`)

// rawOrder writes what an order's transaction writes at the least: the
// order and its outbox row, as BenchmarkCreateOrder's raw loop does.
func rawOrder(ctx context.Context, pool *pgxpool.Pool) (string, error) {
	id := uuid.Must(uuid.NewV7())
	return "", pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO orders (order_id, customer_id, currency, status, version, total_cents)
			VALUES ($1, 'raw', 'EUR', 'SUBMITTED', 1, 2500)`, id); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO message_outbox (outbox_id, aggregate_type, aggregate_id, message_type,
			message_version, exchange_name, routing_key, payload, headers)
			VALUES ($1, 'order', $2, 'order.submitted', 1, 'orders.events', 'order.submitted', $3, '{}')`,
			uuid.Must(uuid.NewV7()), id.String(), rawPayload)
		return err
	})
}
