package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// finalStatuses are the statuses an order never leaves.
var finalStatuses = map[string]bool{"FULFILLED": true, "REJECTED": true, "CANCELLED": true}

// pageSize is the list endpoint's largest page.
const pageSize = 200

// pollInterval is how often the orders still pending are looked for.
const pollInterval = 250 * time.Millisecond

// orderBody is what every POST sends: one line of an in-stock sku, so that
// the order ends FULFILLED.
var orderBody = []byte(`{"customer_id":"loadgen","currency":"EUR","items":[{"sku":"A-1","quantity":1,"unit_price_cents":500}]}`)

// apiOrder is the part of the API's order that loadgen reads.
type apiOrder struct {
	ID        string    `json:"order_id"`
	Status    string    `json:"status"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// placed is one order loadgen created.
type placed struct {
	sentAt    time.Time     // when its POST left (this machine's clock)
	post      time.Duration // the POST's round trip
	createdAt time.Time     // its created_at (the database's clock)
	finalAt   time.Time     // its updated_at once final (the database's clock); zero until then
	status    string        // its final status; "" until then
}

// latency is the time from the POST to the final status: the POST's round
// trip, then the database's time from creation to the final transition.
func (p *placed) latency() time.Duration { return p.post + p.finalAt.Sub(p.createdAt) }

// generator sends the orders and keeps what became of them.
type generator struct {
	api    string
	token  string // the bearer token, or ""
	client *http.Client
	slots  chan struct{} // one per POST in flight

	sent, created, failed, dropped, finished atomic.Int64

	mu     sync.Mutex
	orders map[string]*placed
	errors map[string]int // failed POSTs by status code, or "no response"
}

func newGenerator(api, token string, concurrency int) *generator {
	transport := http.DefaultTransport.(*http.Transport).Clone()
	// Keep a connection for every POST that may be in flight: with the
	// default of two, a burst would open and close connections by the
	// thousand.
	transport.MaxIdleConnsPerHost = concurrency
	return &generator{
		api:    api,
		token:  token,
		client: &http.Client{Transport: transport, Timeout: 30 * time.Second},
		slots:  make(chan struct{}, concurrency),
		orders: map[string]*placed{},
		errors: map[string]int{},
	}
}

// authorize adds the bearer token to a request to the API (req may be nil:
// NewRequestWithContext's error is handled after).
func (g *generator) authorize(req *http.Request) {
	if req != nil && g.token != "" {
		req.Header.Set("Authorization", "Bearer "+g.token)
	}
}

// expected is the number of orders a run at rate for d sends.
func expected(rate float64, d time.Duration) int {
	return int(math.Round(rate * d.Seconds()))
}

// counts returns the progress of the sending.
func (g *generator) counts() (sent, created, failed, dropped, inFlight int) {
	return int(g.sent.Load()), int(g.created.Load()), int(g.failed.Load()), int(g.dropped.Load()), len(g.slots)
}

func (g *generator) finishedCount() int { return int(g.finished.Load()) }

// send posts expected(rate, d) orders, the i-th at start + i/rate, and
// returns when every POST has been answered (or ctx is done). It returns
// the start and how long sending took.
func (g *generator) send(ctx context.Context, rate float64, d time.Duration) (time.Time, time.Duration) {
	n := expected(rate, d)
	start := time.Now()
	var wg sync.WaitGroup
	timer := time.NewTimer(0)
	defer timer.Stop()
loop:
	for i := range n {
		due := start.Add(time.Duration(float64(i) / rate * float64(time.Second)))
		timer.Reset(time.Until(due))
		select {
		case <-ctx.Done():
			break loop
		case <-timer.C:
		}
		select {
		case g.slots <- struct{}{}:
			g.sent.Add(1)
			wg.Go(func() {
				defer func() { <-g.slots }()
				g.post(ctx)
			})
		default:
			g.dropped.Add(1)
		}
	}
	wg.Wait()
	return start, time.Since(start)
}

// post creates one order and records the answer.
func (g *generator) post(ctx context.Context) {
	sentAt := time.Now()
	code, o, err := g.createOrder(ctx)
	took := time.Since(sentAt)
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case err != nil:
		g.errors["no response"]++
		g.failed.Add(1)
	case code != http.StatusCreated:
		g.errors[strconv.Itoa(code)]++
		g.failed.Add(1)
	default:
		g.created.Add(1)
		g.orders[o.ID] = &placed{sentAt: sentAt, post: took, createdAt: o.CreatedAt}
	}
}

func (g *generator) createOrder(ctx context.Context) (int, apiOrder, error) {
	var o apiOrder
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, g.api+"/v1/orders", bytes.NewReader(orderBody))
	g.authorize(req)
	if err != nil {
		return 0, o, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := g.client.Do(req)
	if err != nil {
		return 0, o, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		return resp.StatusCode, o, nil
	}
	if err := json.NewDecoder(resp.Body).Decode(&o); err != nil || o.ID == "" {
		// A 201 without an order in it is a broken answer, not an order.
		return 0, o, fmt.Errorf("decode the created order: %w", err)
	}
	return resp.StatusCode, o, nil
}

// await reads the list endpoint until every created order is final, or
// timeout passes, or ctx is done. It returns the last error of a read, if
// the orders were still not all final after it.
func (g *generator) await(ctx context.Context, timeout time.Duration) error {
	// Only this goroutine touches the orders from here on.
	pending := map[string]*placed{}
	for id, p := range g.orders {
		pending[id] = p
	}
	deadline := time.Now().Add(timeout)
	var lastErr error
	for len(pending) > 0 {
		if err := g.poll(ctx, pending); err != nil {
			lastErr = err
		} else {
			lastErr = nil
		}
		if len(pending) == 0 || time.Now().After(deadline) {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(pollInterval):
		}
	}
	return lastErr
}

// poll walks the list of orders, newest first, back to the oldest pending
// one, and takes the orders it finds final out of pending.
func (g *generator) poll(ctx context.Context, pending map[string]*placed) error {
	oldest := time.Time{}
	for _, p := range pending {
		if oldest.IsZero() || p.createdAt.Before(oldest) {
			oldest = p.createdAt
		}
	}
	after := ""
	for len(pending) > 0 {
		orders, next, err := g.listOrders(ctx, after)
		if err != nil {
			return err
		}
		for _, o := range orders {
			if p, ok := pending[o.ID]; ok && finalStatuses[o.Status] {
				p.finalAt, p.status = o.UpdatedAt, o.Status
				delete(pending, o.ID)
				g.finished.Add(1)
			}
		}
		if next == "" || len(orders) == 0 || orders[len(orders)-1].CreatedAt.Before(oldest) {
			return nil
		}
		after = next
	}
	return nil
}

// listOrders reads one page of GET /v1/orders, newest first, after the
// cursor after ("" for the first page). next is "" on the last page.
func (g *generator) listOrders(ctx context.Context, after string) (orders []apiOrder, next string, err error) {
	q := url.Values{"limit": {strconv.Itoa(pageSize)}}
	if after != "" {
		q.Set("after", after)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, g.api+"/v1/orders?"+q.Encode(), nil)
	g.authorize(req)
	if err != nil {
		return nil, "", err
	}
	resp, err := g.client.Do(req)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, "", fmt.Errorf("GET /v1/orders: %s", resp.Status)
	}
	var page struct {
		Orders     []apiOrder `json:"orders"`
		NextCursor *string    `json:"next_cursor"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&page); err != nil {
		return nil, "", fmt.Errorf("GET /v1/orders: %w", err)
	}
	if page.NextCursor != nil {
		next = *page.NextCursor
	}
	return page.Orders, next, nil
}

// points returns the finished orders for the chart: when each POST left,
// counted from start, and its latency.
func (g *generator) points(start time.Time) []point {
	var out []point
	for _, p := range g.orders {
		if p.status != "" {
			out = append(out, point{at: p.sentAt.Sub(start), latency: p.latency()})
		}
	}
	return out
}
