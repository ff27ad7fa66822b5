package failover

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"
)

// API is the order-api the load posts to.
type API struct {
	URL    string       // http://host:port
	Token  string       // a bearer token that may create orders
	Client *http.Client // nil: http.DefaultClient
}

// Order is an order the load placed: answered 201 at Answered.
type Order struct {
	ID string
	// OutOfStock: its sku has no stock; it ends REJECTED, not FULFILLED.
	OutOfStock bool
	Answered   time.Time
}

// Want is the status the order ends in.
func (o Order) Want() string {
	if o.OutOfStock {
		return "REJECTED"
	}
	return "FULFILLED"
}

// Retry is an answer the load posted again after: a 503 (Status), or no
// answer (Status 0, a connection cut or a timeout).
type Retry struct {
	Status int
	At     time.Time
}

// Load places orders at a steady rate until stopped, one in ten for a
// sku out of stock, each until the API answers 201.
type Load struct {
	t    testing.TB
	api  API
	done chan struct{}
	once sync.Once
	wg   sync.WaitGroup

	mu      sync.Mutex
	orders  []Order
	retries []Retry
}

// StartLoad places rate orders a second on api until Stop.
func StartLoad(t testing.TB, api API, rate int) *Load {
	if api.Client == nil {
		api.Client = http.DefaultClient
	}
	ld := &Load{t: t, api: api, done: make(chan struct{})}
	t.Cleanup(func() { ld.Stop() }) // when t ends before its caller stops the load
	ld.wg.Go(func() {
		tick := time.NewTicker(time.Second / time.Duration(rate))
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-ld.done:
				return
			case <-tick.C:
			}
			ld.wg.Go(func() { ld.place(i) })
		}
	})
	return ld
}

// place posts order i under its Idempotency-Key until the API answers
// 201: again after a 503 (a failover's answer: the database is
// unavailable, or the commit's outcome unknown) or no answer, for up to
// two minutes. Another answer fails t.
func (ld *Load) place(i int) {
	o := Order{OutOfStock: i%10 == 1}
	sku := "A-1"
	if o.OutOfStock {
		sku = "OOS-1"
	}
	order := map[string]any{"customer_id": fmt.Sprint("c-", i), "currency": "EUR",
		"items": []map[string]any{{"sku": sku, "quantity": 1, "unit_price_cents": 500}}}
	key := fmt.Sprint("failover-", i)
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
		code, body := ld.post(key, order)
		if code == http.StatusCreated {
			id, _ := body["order_id"].(string)
			o.ID, o.Answered = id, time.Now()
			ld.mu.Lock()
			ld.orders = append(ld.orders, o)
			ld.mu.Unlock()
			return
		}
		if (code != http.StatusServiceUnavailable && code != 0) || time.Now().After(deadline) {
			ld.t.Errorf("create order %d: %d %v", i, code, body)
			return
		}
		ld.mu.Lock()
		ld.retries = append(ld.retries, Retry{Status: code, At: time.Now()})
		ld.mu.Unlock()
	}
}

// post posts order under key; no answer is status 0.
func (ld *Load) post(key string, order map[string]any) (int, map[string]any) {
	b, _ := json.Marshal(order)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, ld.api.URL+"/v1/orders", bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+ld.api.Token)
	req.Header.Set("Idempotency-Key", key)
	resp, err := ld.api.Client.Do(req)
	if err != nil {
		return 0, nil
	}
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out
}

// AnsweredAfter says whether an order has been answered 201 after at.
func (ld *Load) AnsweredAfter(at time.Time) bool {
	ld.mu.Lock()
	defer ld.mu.Unlock()
	for _, o := range ld.orders {
		if o.Answered.After(at) {
			return true
		}
	}
	return false
}

// Retries are the answers posted again so far.
func (ld *Load) Retries() []Retry {
	ld.mu.Lock()
	defer ld.mu.Unlock()
	return append([]Retry(nil), ld.retries...)
}

// Retried counts the answers of status posted again (0: no answer).
func (ld *Load) Retried(status int) int {
	n := 0
	for _, r := range ld.Retries() {
		if r.Status == status {
			n++
		}
	}
	return n
}

// Stop stops placing orders, waits for those under way, and returns the
// orders answered 201.
func (ld *Load) Stop() []Order {
	ld.once.Do(func() { close(ld.done) })
	ld.wg.Wait()
	ld.mu.Lock()
	defer ld.mu.Unlock()
	return ld.orders
}
