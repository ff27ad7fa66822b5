package schema_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/yourorg/orders/internal/domain"
	"github.com/yourorg/orders/internal/domain/schema"
)

// Every example of the catalogue, as its producer encodes it, matches its
// schema.
func TestEveryExampleMatchesItsSchema(t *testing.T) {
	t.Parallel()
	for _, m := range domain.Examples() {
		body, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if err := schema.Validate(m.MessageType(), m.MessageVersion(), body); err != nil {
			t.Errorf("%s v%d example %s: %v", m.MessageType(), m.MessageVersion(), body, err)
		}
	}
}

// The schema is what encoding/json makes of the Go type: every field by
// its json name, in order, required unless omitempty.
func TestSchemaFollowsTheGoType(t *testing.T) {
	t.Parallel()
	s, err := schema.Of(domain.OrderSubmittedV1{})
	if err != nil {
		t.Fatal(err)
	}
	got, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	const id = `{"type":"string","format":"uuid","not":{"const":"00000000-0000-0000-0000-000000000000"}}`
	const int64s = `"minimum":-9223372036854775808,"maximum":9223372036854775807`
	want := `{"title":"order.submitted, version 1","type":"object","properties":{` +
		`"order_id":` + id + `,"customer_id":{"type":"string"},"currency":{"type":"string"},` +
		`"total_cents":{"type":"integer",` + int64s + `},` +
		`"items":{"type":"array","items":{"type":"object","properties":{"sku":{"type":"string"},` +
		`"quantity":{"type":"integer",` + int64s + `},"unit_price_cents":{"type":"integer",` + int64s + `}},` +
		`"required":["sku","quantity","unit_price_cents"]}}},` +
		`"required":["order_id","customer_id","currency","total_cents","items"]}`
	if string(got) != want {
		t.Errorf("schema of OrderSubmittedV1:\n got %s\nwant %s", got, want)
	}

	rejected, err := schema.Of(domain.FulfillmentRejectedV1{})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(rejected.Required, ",") != "order_id,reason" {
		t.Errorf("FulfillmentRejectedV1 requires %v; skus is omitempty", rejected.Required)
	}
}

// A payload type with a field the schemas cannot describe yet is an error
// that names the field, not a wrong schema.
func TestUnsupportedFieldIsAnError(t *testing.T) {
	t.Parallel()
	_, err := schema.Of(withMap{})
	if err == nil || !strings.Contains(err.Error(), "withMap.Extra") {
		t.Fatalf("err = %v, want one naming withMap.Extra", err)
	}
}

type withMap struct {
	ID    uuid.UUID         `json:"order_id"`
	Extra map[string]string `json:"extra"`
}

func (withMap) MessageType() string   { return "test.with_map" }
func (withMap) MessageVersion() int   { return 1 }
func (m withMap) OrderID() uuid.UUID  { return m.ID }
func (m withMap) AggregateID() string { return m.ID.String() }
func (withMap) Validate() error       { return nil }

// Each way a payload can break its schema is an ErrMalformedMessage that
// says where and how; an unknown type or version is what DecodeMessage
// says of it.
func TestViolationsAreNamed(t *testing.T) {
	t.Parallel()
	const id = `"0193a3c4-2f6e-7d1a-9b3c-4d5e6f708190"`
	for _, tc := range []struct {
		typ     string
		version int
		body    string
		want    error
		says    string
	}{
		{domain.TypeOrderCancelled, 1, `{}`, domain.ErrMalformedMessage, "at /: missing property 'order_id'"},
		{domain.TypeOrderCancelled, 1, `{"order_id":"not-a-uuid"}`, domain.ErrMalformedMessage, "at /order_id: 'not-a-uuid' is not valid uuid"},
		{domain.TypeOrderCancelled, 1, `{"order_id":"00000000-0000-0000-0000-000000000000"}`, domain.ErrMalformedMessage, "at /order_id: the nil UUID is no id"},
		{domain.TypeOrderCancelled, 1, `{"order_id":42}`, domain.ErrMalformedMessage, "at /order_id: got number, want string"},
		{domain.TypeOrderCancelled, 1, `[]`, domain.ErrMalformedMessage, "at /: got array, want object"},
		{domain.TypeOrderCancelled, 1, `{"order_id":` + id + `} {}`, domain.ErrMalformedMessage, "not one JSON value"},
		{domain.TypeOrderCancelled, 1, `{"order_id":`, domain.ErrMalformedMessage, "not one JSON value"},
		{domain.TypeOrderSubmitted, 1, `{"order_id":` + id + `,"customer_id":"c","currency":"EUR","total_cents":1,"items":[{"sku":"A","quantity":"2","unit_price_cents":1}]}`,
			domain.ErrMalformedMessage, "at /items/0/quantity: got string, want integer"},
		{domain.TypeOrderSubmitted, 1, `{"order_id":` + id + `,"customer_id":"c","currency":"EUR","total_cents":1e40,"items":null}`,
			domain.ErrMalformedMessage, "at /items: got null, want array; at /total_cents: maximum: got 1×10⁴⁰, want 9.223372036854776×10¹⁸"},
		{"order.shipped", 1, `{}`, domain.ErrUnknownMessageType, `"order.shipped"`},
		{domain.TypeOrderCancelled, 9, `{}`, domain.ErrUnsupportedVersion, "order.cancelled version 9"},
	} {
		err := schema.Validate(tc.typ, tc.version, []byte(tc.body))
		if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s v%d %s: %v; want %v saying %q", tc.typ, tc.version, tc.body, err, tc.want, tc.says)
		}
	}
}

// Fields the schema does not know are allowed: readers ignore them, so a
// producer may add optional ones.
func TestUnknownFieldsAreAllowed(t *testing.T) {
	t.Parallel()
	body := `{"order_id":"0193a3c4-2f6e-7d1a-9b3c-4d5e6f708190","cancelled_by":"operator-1"}`
	if err := schema.Validate(domain.TypeOrderCancelled, 1, []byte(body)); err != nil {
		t.Fatal(err)
	}
}
