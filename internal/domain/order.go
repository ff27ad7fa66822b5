package domain

import (
	"fmt"
	"regexp"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
)

// Limits of an order, as the API contract states them.
const (
	MaxCustomerIDLen   = 64
	MaxSKULen          = 64
	MaxItems           = 100
	MaxQuantity        = 10_000
	MaxUnitPriceCents  = 1_000_000_000
	currencyCodeLength = 3
)

var currencyPattern = regexp.MustCompile(`^[A-Z]{3}$`)

// Item is one line of an order.
type Item struct {
	SKU            string
	Quantity       int
	UnitPriceCents int64
}

// TotalCents is the line total.
func (i Item) TotalCents() int64 { return int64(i.Quantity) * i.UnitPriceCents }

// Order is an order and where it stands in its life cycle.
type Order struct {
	id         uuid.UUID
	customerID string
	currency   string
	status     Status
	version    int
	items      []Item
	createdAt  time.Time
	updatedAt  time.Time
}

// NewOrder validates a new order and returns it in status SUBMITTED. The
// error is a *ValidationError listing every broken rule.
func NewOrder(id uuid.UUID, customerID, currency string, items []Item) (*Order, error) {
	var v ValidationError
	checkLength(&v, "customer_id", customerID, MaxCustomerIDLen)
	if !currencyPattern.MatchString(currency) {
		v.Add("currency", "must be %d upper-case letters (ISO 4217)", currencyCodeLength)
	}
	switch {
	case len(items) == 0:
		v.Add("items", "must hold at least 1 item")
	case len(items) > MaxItems:
		v.Add("items", "must hold at most %d items", MaxItems)
	}
	for i, it := range items {
		field := fmt.Sprintf("items[%d]", i)
		checkLength(&v, field+".sku", it.SKU, MaxSKULen)
		if it.Quantity < 1 || it.Quantity > MaxQuantity {
			v.Add(field+".quantity", "must be between 1 and %d", MaxQuantity)
		}
		if it.UnitPriceCents < 0 || it.UnitPriceCents > MaxUnitPriceCents {
			v.Add(field+".unit_price_cents", "must be between 0 and %d", MaxUnitPriceCents)
		}
	}
	if err := v.Err(); err != nil {
		return nil, err
	}
	return &Order{
		id:         id,
		customerID: customerID,
		currency:   currency,
		status:     StatusSubmitted,
		version:    1,
		items:      append([]Item(nil), items...),
	}, nil
}

func checkLength(v *ValidationError, field, s string, maxLen int) {
	n := utf8.RuneCountInString(s)
	switch {
	case !utf8.ValidString(s):
		v.Add(field, "must be valid UTF-8")
	case n == 0:
		v.Add(field, "is required")
	case n > maxLen:
		v.Add(field, "must be at most %d characters", maxLen)
	case strings.ContainsRune(s, 0):
		v.Add(field, "must not contain a NUL character") // PostgreSQL text cannot hold one
	}
}

// OrderFromDatabase rehydrates an order that was valid when it was stored.
// It validates nothing: use NewOrder for input.
func OrderFromDatabase(id uuid.UUID, customerID, currency string, status Status, version int, items []Item, createdAt, updatedAt time.Time) *Order {
	return &Order{
		id: id, customerID: customerID, currency: currency, status: status,
		version: version, items: items, createdAt: createdAt, updatedAt: updatedAt,
	}
}

func (o *Order) ID() uuid.UUID        { return o.id }
func (o *Order) CustomerID() string   { return o.customerID }
func (o *Order) Currency() string     { return o.currency }
func (o *Order) Status() Status       { return o.status }
func (o *Order) Version() int         { return o.version }
func (o *Order) CreatedAt() time.Time { return o.createdAt }
func (o *Order) UpdatedAt() time.Time { return o.updatedAt }

// Items returns a copy of the order's lines.
func (o *Order) Items() []Item { return append([]Item(nil), o.items...) }

// TotalCents is the sum of the line totals.
func (o *Order) TotalCents() int64 {
	var total int64
	for _, it := range o.items {
		total += it.TotalCents()
	}
	return total
}
