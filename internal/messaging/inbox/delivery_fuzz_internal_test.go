package inbox

import (
	"math"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/yourorg/orders/internal/messaging"
)

// The envelope decoder (parseDelivery) on any delivery: any message id,
// type and content type, and message_version and retry_attempt headers of
// any of the types an AMQP table carries. It never panics; it either
// accepts the envelope (a message id, a type, a version of at least 1, an
// attempt of at least 1, JSON or no content type) or refuses it with a
// permanent failure under a code that names the refusal, which parks the
// message with that reason. The seed corpus (testdata/fuzz/FuzzParseDelivery)
// runs with every go test; `go test -fuzz FuzzParseDelivery` explores from
// it.
func FuzzParseDelivery(f *testing.F) {
	f.Add("01a234e1-a6b5-7cd8-9ed0-91da90ca9481", "order.submitted", messaging.ContentTypeJSON, byte(3), int64(1), "", 0.0, byte(3), int64(1), []byte(`{"order_id":"x"}`))
	f.Add("m-1", "order.fulfilled", "", byte(5), int64(0), "2", 0.0, byte(0), int64(0), []byte(`{}`))
	f.Add("", "order.submitted", messaging.ContentTypeJSON, byte(3), int64(1), "", 0.0, byte(3), int64(1), []byte(nil))
	f.Add("m-2", "", messaging.ContentTypeJSON, byte(3), int64(1), "", 0.0, byte(3), int64(1), []byte(nil))
	f.Add("m-3", "order.submitted", messaging.ContentTypeJSON, byte(0), int64(0), "", 0.0, byte(0), int64(0), []byte(nil))
	f.Add("m-4", "order.submitted", "text/plain", byte(3), int64(1), "", 0.0, byte(3), int64(1), []byte("hello"))
	f.Add("m-5", "order.submitted", messaging.ContentTypeJSON, byte(3), int64(-7), "", 0.0, byte(3), int64(-2), []byte(nil))
	f.Add("m-6", "order.submitted", messaging.ContentTypeJSON, byte(6), int64(0), "", 1e300, byte(6), int64(0), []byte(nil))
	f.Add("m-7", "order.submitted", messaging.ContentTypeJSON, byte(7), int64(0), "1", 0.0, byte(8), int64(0), []byte(nil))
	f.Add("m-8", "order.submitted", messaging.ContentTypeJSON, byte(4), int64(math.MaxInt64), "", 0.0, byte(4), int64(math.MinInt64), []byte(nil))
	f.Fuzz(func(t *testing.T, id, typ, contentType string, vKind byte, vInt int64, vStr string, vFloat float64,
		aKind byte, aInt int64, body []byte) {
		headers := amqp.Table{}
		if v, ok := headerValue(vKind, vInt, vStr, vFloat); ok {
			headers[messaging.HeaderMessageVersion] = v
		}
		if v, ok := headerValue(aKind, aInt, vStr, vFloat); ok {
			headers[HeaderRetryAttempt] = v
		}
		raw := amqp.Delivery{MessageId: id, Type: typ, ContentType: contentType, Headers: headers, Body: body}

		d, err := parseDelivery(raw)
		if d == nil {
			t.Fatal("no delivery returned: the failure path needs its message id and type")
		}
		if err != nil {
			code, permanent := Classify(err)
			if !permanent || code == "" || code == "handler_error" {
				t.Fatalf("refusal %v: code %q, permanent %v; want a permanent failure under its own code", err, code, permanent)
			}
			if !strings.HasPrefix(err.Error(), code+": ") || len(err.Error()) <= len(code)+2 {
				t.Fatalf("refusal %q does not say why", err)
			}
			return
		}
		switch {
		case d.MessageID == "" || d.Type == "":
			t.Fatalf("accepted an envelope without a message id or type: %+v", d)
		case d.Version < 1:
			t.Fatalf("accepted version %d", d.Version)
		case d.Attempt < 1:
			t.Fatalf("attempt %d", d.Attempt)
		case contentType != "" && contentType != messaging.ContentTypeJSON:
			t.Fatalf("accepted content type %q", contentType)
		}
		_ = d.inboxEntry("fuzz") // the inbox row of any accepted envelope
	})
}

// headerValue builds a header of one of the types an AMQP table holds
// (amqp091 decodes field values into these), or none.
func headerValue(kind byte, n int64, s string, fl float64) (any, bool) {
	switch kind % 12 {
	case 0:
		return nil, false // absent
	case 1:
		return int8(n), true
	case 2:
		return int16(n), true
	case 3:
		return int32(n), true
	case 4:
		return n, true
	case 5:
		return s, true
	case 6:
		return fl, true
	case 7:
		return []byte(s), true
	case 8:
		return n%2 == 0, true
	case 9:
		return float32(fl), true
	case 10:
		return uint8(n), true
	default:
		return amqp.Table{"nested": n}, true
	}
}
