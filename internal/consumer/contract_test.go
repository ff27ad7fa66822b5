package consumer_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	metricnoop "go.opentelemetry.io/otel/metric/noop"

	"github.com/yourorg/orders/internal/consumer/consumertest"
	"github.com/yourorg/orders/internal/consumer/fulfillment"
	"github.com/yourorg/orders/internal/domain"
	"github.com/yourorg/orders/internal/messaging/inbox"
	"github.com/yourorg/orders/internal/messaging/inbox/inboxadmin"
	"github.com/yourorg/orders/internal/store"
	"github.com/yourorg/orders/internal/testenv"
)

// The consumers hold every body to the JSON Schema of its type and version
// (consumer.Inbox, the schemas of api/asyncapi.yaml) before they decode
// it: one that breaks it is parked as schema_violation, its parked_reason
// saying where, and moves nothing; the good message beside it flows. Among
// them, the two a Go decoder alone would have read: an order_id in URN
// form (uuid.Parse takes it), and a second key "ORDER_ID" (encoding/json
// reads it into order_id, here naming another order, which it would have
// moved). The one payload the schema lets through and the decoder does
// not, an integer spelled 2.0, is parked by the decoder, as
// malformed_message (internal/domain/schema says why).
func TestSchemaViolationsAreParked(t *testing.T) {
	t.Parallel()
	h := consumertest.Start(t, fulfillment.New(fulfillment.Config{MeterProvider: metricnoop.NewMeterProvider()}))
	var orders []*domain.Order
	for range 2 {
		o, err := domain.NewOrder(uuid.Must(uuid.NewV7()), "c-1", "EUR", []domain.Item{{SKU: "A-1", Quantity: 2, UnitPriceCents: 100}})
		if err != nil {
			t.Fatal(err)
		}
		err = pgx.BeginFunc(h.Ctx, h.Pool, func(tx pgx.Tx) error {
			_, err := store.CreateOrder(h.Ctx, tx, o, domain.Cause{CorrelationID: "c"})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		orders = append(orders, o)
	}
	good, other := orders[0], orders[1]
	submitted := func(orderID, quantity, extra string) []byte {
		return fmt.Appendf(nil, `{"order_id":%q,"customer_id":"c-1","currency":"EUR","total_cents":200,`+
			`"items":[{"sku":"A-1","quantity":%s,"unit_price_cents":100}]%s}`, orderID, quantity, extra)
	}
	bad := []struct {
		body       []byte
		code, says string
	}{
		{submitted(other.ID().String(), `"2"`, ""),
			"schema_violation", "at /items/0/quantity: got string, want integer"},
		{submitted("urn:uuid:"+other.ID().String(), "2", ""),
			"schema_violation", "at /order_id: not a valid uuid"},
		{submitted(uuid.Must(uuid.NewV7()).String(), "2", fmt.Sprintf(`,"ORDER_ID":%q`, other.ID())),
			"schema_violation", `at /: key "ORDER_ID" is "order_id" in another case: keys are case-sensitive`},
		{submitted(other.ID().String(), "2.0", ""),
			"malformed_message", "cannot unmarshal number 2.0"},
	}
	ids := map[string]int{}
	for i, b := range bad {
		ids[h.DeliverBody(domain.TypeOrderSubmitted, 1, b.body)] = i
	}
	goodID := h.Deliver(domain.SubmittedMessage(good))

	if row := h.WaitDone(fulfillment.Name, goodID); row.Status != inbox.StatusProcessed {
		t.Fatalf("the good message beside them: %+v, want PROCESSED", row)
	}
	for id, i := range ids {
		if row := h.WaitDone(fulfillment.Name, id); row.Status != inbox.StatusPermanentFailed || row.LastErrorCode != bad[i].code {
			t.Errorf("%s: inbox row %+v, want PERMANENT_FAILED %s", bad[i].body, row, bad[i].code)
		}
	}
	var parked []inboxadmin.Parked
	testenv.WaitFor(t, 15*time.Second, "the bad messages in the parking lot", func() bool {
		var err error
		parked, err = inboxadmin.Browse(h.Ctx, h.AMQPURL, fulfillment.Name, 0)
		if err != nil {
			t.Fatal(err)
		}
		return len(parked) >= len(bad)
	})
	if len(parked) != len(bad) {
		t.Fatalf("%d parked, want %d", len(parked), len(bad))
	}
	for _, p := range parked {
		i, ok := ids[p.MessageID]
		if !ok {
			t.Fatalf("parked %s, which is not one of the bad messages", p.MessageID)
		}
		if p.ReasonCode != bad[i].code || !strings.HasPrefix(p.Reason, bad[i].code+": ") || !strings.Contains(p.Reason, bad[i].says) {
			t.Errorf("%s parked as %s: %q; want %s saying %q", bad[i].body, p.ReasonCode, p.Reason, bad[i].code, bad[i].says)
		}
	}
	for _, o := range []*domain.Order{good, other} {
		got, err := store.GetOrder(h.Ctx, h.Pool, o.ID())
		if err != nil {
			t.Fatal(err)
		}
		if want := map[bool]domain.Status{true: domain.StatusFulfillmentRequested, false: domain.StatusSubmitted}[o == good]; got.Status() != want {
			t.Errorf("order %s is %s, want %s", o.ID(), got.Status(), want)
		}
	}
}
