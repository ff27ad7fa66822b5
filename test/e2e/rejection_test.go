package e2e

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

// An order with a sku out of stock ends REJECTED, and the API says why:
// the REJECTED row of its history, as GET /v1/orders/{order_id} answers it
// (checked against api/openapi.yaml by s.client), has the warehouse's
// reason naming that sku and no other, and no other row has a reason.
func TestRejectionSaysWhyThroughTheAPI(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	s.startAPI()
	s.startConsumer("consumer")
	s.startRelay("relay")

	code, body := s.post("/v1/orders", map[string]any{"customer_id": "c-1", "currency": "EUR",
		"items": []map[string]any{{"sku": "A-1", "quantity": 1, "unit_price_cents": 500}, {"sku": "OOS-42", "quantity": 2, "unit_price_cents": 700}}})
	if code != http.StatusCreated {
		t.Fatalf("create: %d %v", code, body)
	}
	id := body["order_id"].(string)
	s.waitStatus(id, "REJECTED")

	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, s.apiURL+"/v1/orders/"+id, http.NoBody)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+s.token)
	resp, err := s.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET the order: %d %s (%v)", resp.StatusCode, raw, err)
	}
	var order struct {
		Status  string `json:"status"`
		History []struct {
			ToStatus string  `json:"to_status"`
			Reason   *string `json:"reason"`
		} `json:"history"`
	}
	if err := json.Unmarshal(raw, &order); err != nil {
		t.Fatal(err)
	}
	if order.Status != "REJECTED" || len(order.History) != 3 {
		t.Fatalf("order %s with %d history rows, want REJECTED after 3: %s", order.Status, len(order.History), raw)
	}
	for _, h := range order.History[:2] {
		if h.Reason != nil {
			t.Errorf("the move to %s has a reason %q: only the rejection says why", h.ToStatus, *h.Reason)
		}
	}
	last := order.History[2]
	if last.ToStatus != "REJECTED" || last.Reason == nil {
		t.Fatalf("the last row %+v: want REJECTED with a reason: %s", last, raw)
	}
	if r := *last.Reason; !strings.Contains(r, "out of stock") || !strings.Contains(r, "OOS-42") || strings.Contains(r, "A-1") {
		t.Errorf("the rejection's reason is %q: want it to say out of stock and name OOS-42 (and not A-1, in stock)", r)
	}
}
