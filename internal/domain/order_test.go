package domain_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/yourorg/orders/internal/domain"
)

func newOrder(t *testing.T) *domain.Order {
	t.Helper()
	o, err := domain.NewOrder(uuid.New(), "c-1", "EUR", []domain.Item{{SKU: "A-1", Quantity: 2, UnitPriceCents: 1250}})
	if err != nil {
		t.Fatal(err)
	}
	return o
}

func TestNewOrder(t *testing.T) {
	t.Parallel()
	o, err := domain.NewOrder(uuid.New(), "c-1", "EUR", []domain.Item{
		{SKU: "A-1", Quantity: 2, UnitPriceCents: 1250},
		{SKU: "B-2", Quantity: 10000, UnitPriceCents: 1_000_000_000},
	})
	if err != nil {
		t.Fatal(err)
	}
	if o.Status() != domain.StatusSubmitted || o.Version() != 1 {
		t.Errorf("new order is %s v%d", o.Status(), o.Version())
	}
	if want := int64(2*1250 + 10000*1_000_000_000); o.TotalCents() != want {
		t.Errorf("TotalCents = %d, want %d", o.TotalCents(), want)
	}
}

// TestNewOrderRules checks each rule at its boundary: the last good value
// passes and the first bad one fails, naming the field.
func TestNewOrderRules(t *testing.T) {
	t.Parallel()
	item := func(sku string, q int, p int64) []domain.Item {
		return []domain.Item{{SKU: sku, Quantity: q, UnitPriceCents: p}}
	}
	many := func(n int) []domain.Item {
		items := make([]domain.Item, n)
		for i := range items {
			items[i] = domain.Item{SKU: "S", Quantity: 1}
		}
		return items
	}
	cases := []struct {
		name      string
		customer  string
		currency  string
		items     []domain.Item
		wantField string // "" = valid
	}{
		{"customer 1 char", "c", "EUR", item("A", 1, 0), ""},
		{"customer 64 chars", strings.Repeat("c", 64), "EUR", item("A", 1, 0), ""},
		{"customer 64 multibyte chars", strings.Repeat("é", 64), "EUR", item("A", 1, 0), ""},
		{"customer empty", "", "EUR", item("A", 1, 0), "customer_id"},
		{"customer 65 chars", strings.Repeat("c", 65), "EUR", item("A", 1, 0), "customer_id"},
		{"customer invalid utf-8", "\xff", "EUR", item("A", 1, 0), "customer_id"},
		{"customer with NUL", "c\x00d", "EUR", item("A", 1, 0), "customer_id"},
		{"sku with NUL", "c", "EUR", item("A\x00", 1, 0), "items[0].sku"},
		{"currency lower case", "c", "eur", item("A", 1, 0), "currency"},
		{"currency 2 letters", "c", "EU", item("A", 1, 0), "currency"},
		{"currency 4 letters", "c", "EURO", item("A", 1, 0), "currency"},
		{"currency digits", "c", "E1R", item("A", 1, 0), "currency"},
		{"no items", "c", "EUR", nil, "items"},
		{"100 items", "c", "EUR", many(100), ""},
		{"101 items", "c", "EUR", many(101), "items"},
		{"sku empty", "c", "EUR", item("", 1, 0), "items[0].sku"},
		{"sku 64 chars", "c", "EUR", item(strings.Repeat("s", 64), 1, 0), ""},
		{"sku 65 chars", "c", "EUR", item(strings.Repeat("s", 65), 1, 0), "items[0].sku"},
		{"quantity 0", "c", "EUR", item("A", 0, 0), "items[0].quantity"},
		{"quantity 10000", "c", "EUR", item("A", 10000, 0), ""},
		{"quantity 10001", "c", "EUR", item("A", 10001, 0), "items[0].quantity"},
		{"quantity negative", "c", "EUR", item("A", -1, 0), "items[0].quantity"},
		{"price 0", "c", "EUR", item("A", 1, 0), ""},
		{"price 10^9", "c", "EUR", item("A", 1, 1_000_000_000), ""},
		{"price 10^9+1", "c", "EUR", item("A", 1, 1_000_000_001), "items[0].unit_price_cents"},
		{"price negative", "c", "EUR", item("A", 1, -1), "items[0].unit_price_cents"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			_, err := domain.NewOrder(uuid.New(), c.customer, c.currency, c.items)
			if c.wantField == "" {
				if err != nil {
					t.Fatalf("want valid, got %v", err)
				}
				return
			}
			var v *domain.ValidationError
			if !errors.As(err, &v) || !errors.Is(err, domain.ErrValidation) {
				t.Fatalf("want a ValidationError, got %v", err)
			}
			if len(v.Fields) != 1 || v.Fields[0].Field != c.wantField {
				t.Fatalf("fields = %+v, want exactly %s", v.Fields, c.wantField)
			}
		})
	}
}

func TestNewOrderReportsEveryBrokenRule(t *testing.T) {
	t.Parallel()
	_, err := domain.NewOrder(uuid.New(), "", "x", []domain.Item{{SKU: "", Quantity: 0, UnitPriceCents: -1}})
	var v *domain.ValidationError
	if !errors.As(err, &v) || len(v.Fields) != 5 {
		t.Fatalf("want 5 broken rules, got %v", err)
	}
}
