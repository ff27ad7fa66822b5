package httpapi

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"reflect"
	"testing"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/labstack/echo/v4"
)

// The body of POST /v1/orders, whatever it holds, is either an order or a
// clear refusal: decodeJSON and toOrder never panic, and each refusal is a
// 400 malformed_json or invalid_type, a 413 (only past 64 KiB) or a 422 validation_failed
// naming each broken rule, with a detail that says what is wrong. A body
// that is accepted is one valid JSON value, and reads back the same once
// re-encoded. The seed corpus (testdata/fuzz/FuzzCreateOrderBody) runs
// with every go test; `go test -fuzz FuzzCreateOrderBody` explores from
// it.
func FuzzCreateOrderBody(f *testing.F) {
	e := echo.New()
	decode := func(body []byte) (createOrderRequest, error) {
		req := httptest.NewRequest(http.MethodPost, "/v1/orders", bytes.NewReader(body))
		req.Header.Set(echo.HeaderContentType, echo.MIMEApplicationJSON)
		var r createOrderRequest
		err := decodeJSON(e.NewContext(req, httptest.NewRecorder()), &r)
		return r, err
	}
	// Past the 64 KiB limit (too large for a file of the corpus).
	f.Add(append([]byte(`{"customer_id":"`), bytes.Repeat([]byte("x"), maxBodyBytes)...))
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := decode(body)
		if err == nil {
			if !utf8.Valid(body) || !json.Valid(body) {
				t.Fatalf("accepted %q, which is not one valid JSON value", body)
			}
			canonical, mErr := json.Marshal(r)
			if mErr != nil {
				t.Fatal(mErr)
			}
			again, againErr := decode(canonical)
			if againErr != nil || !reflect.DeepEqual(again, r) {
				t.Fatalf("%q decodes to %+v; re-encoded, %s decodes to %+v (%v)", body, r, canonical, again, againErr)
			}
			_ = r.hash()
			if _, err = r.toOrder(uuid.Must(uuid.NewV7())); err == nil {
				return
			}
		}
		p := problemFor(err)
		switch {
		case p.Status == http.StatusBadRequest && (p.Code == "malformed_json" || p.Code == "invalid_type"):
		case p.Status == http.StatusRequestEntityTooLarge && len(body) > maxBodyBytes:
		case p.Status == http.StatusUnprocessableEntity && p.Code == "validation_failed" && len(p.Errors) > 0:
			for _, fe := range p.Errors {
				if fe.Field == "" || fe.Message == "" {
					t.Fatalf("%q: a broken rule without a field or a message: %+v", body, p.Errors)
				}
			}
		default:
			t.Fatalf("%q: %v, answered %d %s", body, err, p.Status, p.Code)
		}
		if p.Detail == "" {
			t.Fatalf("%q: %d %s without a detail", body, p.Status, p.Code)
		}
	})
}
