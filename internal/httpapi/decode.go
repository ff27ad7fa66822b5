package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"reflect"
	"strings"
	"unicode/utf8"

	"github.com/labstack/echo/v4"
)

// maxBodyBytes caps a request body (docs/contract.md: 64 KiB, else 413).
const maxBodyBytes = 64 << 10

// decodeJSON reads the body of c into dst, strictly: the content type must
// be JSON (415), the body at most 64 KiB (413), and (else 400) valid UTF-8,
// one well-formed JSON value with nothing after it, whose keys each name a
// field of dst exactly. encoding/json alone would let through what the
// checks around it catch: it turns invalid UTF-8 into U+FFFD, matches keys
// case-insensitively ("Customer_ID" fills customer_id), and Decoder.More
// does not see a stray "]" or "}" after the value.
func decodeJSON(c echo.Context, dst any) error {
	req := c.Request()
	mediaType, _, err := mime.ParseMediaType(req.Header.Get(echo.HeaderContentType))
	if err != nil || mediaType != echo.MIMEApplicationJSON {
		return newError(http.StatusUnsupportedMediaType, "unsupported_media_type",
			"The request body must be application/json.")
	}
	body, err := io.ReadAll(http.MaxBytesReader(c.Response(), req.Body, maxBodyBytes))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return err
		}
		return newError(http.StatusBadRequest, "unreadable_body", "The request body could not be read.")
	}
	if !utf8.Valid(body) {
		return newError(http.StatusBadRequest, "malformed_json", "The body is not valid UTF-8.")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		return newError(http.StatusBadRequest, "malformed_json", describeJSONError(err))
	}
	if rest := bytes.TrimLeft(body[dec.InputOffset():], " \t\r\n"); len(rest) > 0 {
		return newError(http.StatusBadRequest, "malformed_json", "The body holds more than one JSON value.")
	}
	var generic any
	if err := json.Unmarshal(body, &generic); err != nil {
		return newError(http.StatusBadRequest, "malformed_json", describeJSONError(err))
	}
	return exactKeys(generic, reflect.TypeOf(dst), "")
}

// exactKeys checks that every key of v (a decoded JSON value) is, exactly,
// the JSON name of a field of t at the same place; else it returns the 400
// that names the first key that is not. It knows the shapes the
// request types use: structs (without embedded ones), slices and pointers.
func exactKeys(v any, t reflect.Type, path string) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Struct:
		obj, ok := v.(map[string]any)
		if !ok {
			return nil // a type mismatch, which Decode reported
		}
		fields := make(map[string]reflect.Type, t.NumField())
		for i := range t.NumField() {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "" {
				name = f.Name
			}
			if f.IsExported() && name != "-" {
				fields[name] = f.Type
			}
		}
		for key, val := range obj {
			ft, ok := fields[key]
			if !ok {
				return newError(http.StatusBadRequest, "malformed_json",
					fmt.Sprintf("Unknown field %q: field names are case-sensitive.", path+key))
			}
			if err := exactKeys(val, ft, path+key+"."); err != nil {
				return err
			}
		}
	case reflect.Slice, reflect.Array:
		arr, ok := v.([]any)
		if !ok {
			return nil
		}
		for i, val := range arr {
			if err := exactKeys(val, t.Elem(), fmt.Sprintf("%s[%d].", strings.TrimSuffix(path, "."), i)); err != nil {
				return err
			}
		}
	}
	return nil
}

func describeJSONError(err error) string {
	var (
		syntaxErr *json.SyntaxError
		typeErr   *json.UnmarshalTypeError
	)
	switch {
	case errors.As(err, &syntaxErr):
		return fmt.Sprintf("The body is not valid JSON (at byte %d).", syntaxErr.Offset)
	case errors.As(err, &typeErr):
		return fmt.Sprintf("Field %s must be a JSON %s.", typeErr.Field, jsonKind(typeErr.Type.Kind().String()))
	case errors.Is(err, io.EOF):
		return "The body is empty."
	case errors.Is(err, io.ErrUnexpectedEOF):
		return "The body ends in the middle of a JSON value."
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		return fmt.Sprintf("Unknown field %s.", strings.TrimPrefix(err.Error(), "json: unknown field "))
	}
	return "The body is not valid JSON."
}

func jsonKind(goKind string) string {
	switch goKind {
	case "int", "int32", "int64", "uint", "float64":
		return "number"
	case "slice":
		return "array"
	case "struct", "map", "ptr":
		return "object"
	}
	return goKind
}
