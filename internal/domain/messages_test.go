package domain_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/yourorg/orders/internal/domain"
)

func TestDecodeMessageRoundTrip(t *testing.T) {
	t.Parallel()
	id := uuid.New()
	msgs := []domain.Message{
		domain.SubmittedMessage(newOrder(t)),
		domain.FulfillmentRequestedV1{ID: id, Items: []domain.ItemLine{{SKU: "A", Quantity: 1}}},
		domain.FulfillmentCompletedV1{ID: id, ReservationID: uuid.New()},
		domain.FulfillmentRejectedV1{ID: id, Reason: "out of stock", SKUs: []string{"OOS-1"}},
		domain.OrderCancelledV1{ID: id},
		domain.OrderFulfilledV1{ID: id},
		domain.OrderRejectedV1{ID: id, Reason: "out of stock"},
	}
	for _, m := range msgs {
		body, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		got, err := domain.DecodeMessage(m.MessageType(), m.MessageVersion(), body)
		if err != nil {
			t.Fatalf("%s: %v", m.MessageType(), err)
		}
		gotJSON, _ := json.Marshal(got)
		if string(gotJSON) != string(body) || got.OrderID() != m.OrderID() {
			t.Errorf("%s: decoded %s, want %s", m.MessageType(), gotJSON, body)
		}
	}
}

func TestDecodeMessageErrors(t *testing.T) {
	t.Parallel()
	good := `{"order_id":"` + uuid.NewString() + `"}`
	cases := []struct {
		name    string
		typ     string
		version int
		body    string
		want    error
	}{
		{"unknown type", "order.exploded", 1, good, domain.ErrUnknownMessageType},
		{"unsupported version", domain.TypeOrderCancelled, 2, good, domain.ErrUnsupportedVersion},
		{"bad JSON", domain.TypeOrderCancelled, 1, `{"order_id":`, domain.ErrMalformedMessage},
		{"not an object", domain.TypeOrderCancelled, 1, `[1,2]`, domain.ErrMalformedMessage},
		{"trailing data", domain.TypeOrderCancelled, 1, good + `{}`, domain.ErrMalformedMessage},
		{"a stray brace after it", domain.TypeOrderCancelled, 1, good + ` }`, domain.ErrMalformedMessage},
		{"a stray bracket after it", domain.TypeOrderCancelled, 1, good + `]`, domain.ErrMalformedMessage},
		{"order_id in capitals", domain.TypeOrderCancelled, 1, strings.ToUpper(good), domain.ErrMalformedMessage},
		{"order_id twice, once in capitals", domain.TypeOrderCancelled, 1,
			`{"order_id":"` + uuid.NewString() + `","Order_ID":"` + uuid.NewString() + `"}`, domain.ErrMalformedMessage},
		{"a nested key in capitals", domain.TypeOrderSubmitted, 1,
			`{"order_id":"` + uuid.NewString() + `","items":[{"SKU":"A-1","quantity":1,"unit_price_cents":1}]}`, domain.ErrMalformedMessage},
		{"missing order_id", domain.TypeOrderCancelled, 1, `{}`, domain.ErrMalformedMessage},
		{"bad order_id", domain.TypeOrderCancelled, 1, `{"order_id":"nope"}`, domain.ErrMalformedMessage},
		{"empty body", domain.TypeOrderCancelled, 1, ``, domain.ErrMalformedMessage},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			_, err := domain.DecodeMessage(c.typ, c.version, []byte(c.body))
			if !errors.Is(err, c.want) {
				t.Fatalf("err = %v, want %v", err, c.want)
			}
			t.Log(err)
		})
	}
}

func TestDecodeMessageIgnoresUnknownFields(t *testing.T) {
	t.Parallel()
	id := uuid.New()
	body := `{"order_id":"` + id.String() + `","added_later":true}`
	m, err := domain.DecodeMessage(domain.TypeOrderCancelled, 1, []byte(body))
	if err != nil || m.OrderID() != id {
		t.Fatalf("DecodeMessage = %v, %v", m, err)
	}
}
