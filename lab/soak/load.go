package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"
)

// order is one order the API created.
type order struct {
	id        string
	oos       bool // its sku is out of stock: it ends REJECTED
	cancel    bool // a cancel was posted
	cancelled bool // the API accepted the cancel: it ends CANCELLED
}

// load is what sendOrders did.
type load struct {
	mu      sync.Mutex
	orders  []order
	refused map[string]int // POSTs not answered 201, by status ("no answer": the order may exist)
}

func (l *load) refusedTotal() int {
	n := 0
	for _, v := range l.refused {
		n += v
	}
	return n
}

// sendOrders posts an order every 1/rate seconds until ctx ends: one in
// ten with an out-of-stock sku, one in ten cancelled up to half a second
// later. A POST the API refuses (a 503 while the database is read-only or
// away) is counted and not retried: the order does not exist.
func sendOrders(ctx context.Context, apiURL, token string, rate float64, rng *rand.Rand) *load {
	l := &load{refused: map[string]int{}}
	client := &http.Client{Timeout: 10 * time.Second}
	tick := time.NewTicker(time.Duration(float64(time.Second) / rate))
	defer tick.Stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return l
		case <-tick.C:
		}
		oos, cancel := rng.IntN(10) == 0, rng.IntN(10) == 0
		cancelAfter := time.Duration(rng.Int64N(int64(500 * time.Millisecond)))
		wg.Go(func() {
			sku := "A-1"
			if oos {
				sku = "OOS-1"
			}
			status, body := post(context.WithoutCancel(ctx), client, token, apiURL+"/v1/orders", map[string]any{
				"customer_id": fmt.Sprint("soak-", i), "currency": "EUR",
				"items": []map[string]any{{"sku": sku, "quantity": 1, "unit_price_cents": 500}},
			})
			id, _ := body["order_id"].(string)
			if status != http.StatusCreated || id == "" {
				l.mu.Lock()
				l.refused[statusText(status)]++
				l.mu.Unlock()
				return
			}
			o := order{id: id, oos: oos, cancel: cancel}
			if cancel {
				time.Sleep(cancelAfter)
				status, _ := post(context.WithoutCancel(ctx), client, token, apiURL+"/v1/orders/"+id+"/cancel", nil)
				o.cancelled = status == http.StatusOK
			}
			l.mu.Lock()
			l.orders = append(l.orders, o)
			l.mu.Unlock()
		})
	}
}

func post(ctx context.Context, client *http.Client, token, url string, body any) (int, map[string]any) {
	var buf bytes.Buffer
	if body != nil {
		_ = json.NewEncoder(&buf).Encode(body)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, &buf)
	if err != nil {
		return 0, nil
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil
	}
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out
}

func statusText(status int) string {
	if status == 0 {
		return "no answer"
	}
	return fmt.Sprint(status)
}
