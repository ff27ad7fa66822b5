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
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/labstack/echo/v4"
)

// maxBodyBytes caps a request body (docs/contract.md: 64 KiB, else 413).
const maxBodyBytes = 64 << 10

// decodeJSON reads the body of c into dst, strictly: the content type must
// be JSON (415), the body at most 64 KiB (413), and (else 400) valid UTF-8,
// one well-formed JSON value with nothing after it (malformed_json), whose
// keys each name a field of dst exactly and once (malformed_json), and
// whose values each have the JSON type of their field (invalid_type; a
// null is a field left out, except for the body itself). encoding/json
// alone would let through what the checks around it catch: it turns
// invalid UTF-8 into U+FFFD, matches keys case-insensitively
// ("Customer_ID" fills customer_id), lets the last of two equal keys win,
// reads a null body as an empty object, names no array index in its
// errors, and Decoder.More does not see a stray "]" or "}" after the
// value.
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
	// One well-formed value, and nothing after it.
	dec := json.NewDecoder(bytes.NewReader(body))
	var generic any
	if err := dec.Decode(&generic); err != nil {
		return newError(http.StatusBadRequest, "malformed_json", describeJSONError(err))
	}
	if rest := bytes.TrimLeft(body[dec.InputOffset():], " \t\r\n"); len(rest) > 0 {
		return newError(http.StatusBadRequest, "malformed_json", "The body holds more than one JSON value.")
	}
	// Its keys and the types of its values, in the order they come.
	tokens := json.NewDecoder(bytes.NewReader(body))
	tokens.UseNumber()
	if err := checkValue(tokens, reflect.TypeOf(dst), ""); err != nil {
		return err
	}
	// What the checks let through decodes; an error here is one they
	// missed, still the request's.
	if err := json.Unmarshal(body, dst); err != nil {
		return newError(http.StatusBadRequest, "malformed_json", describeJSONError(err))
	}
	return nil
}

// checkValue reads the next JSON value from dec, a decoder of a body that
// is one well-formed value (UseNumber), and checks it against t, the Go
// type it is to fill, at path ("" for the body, else a field's JSON path
// as the 422 errors name it: items[0].quantity). It returns the 400 of the
// first thing that would not fit, in the order of the body: a key that is
// not exactly the JSON name of a field at its place, or one given twice
// (malformed_json); a value whose JSON type its field cannot hold
// (invalid_type). It knows the shapes the request types use: structs
// (without embedded ones), slices, pointers, strings, integers and bools.
func checkValue(dec *json.Decoder, t reflect.Type, path string) error {
	tok, err := dec.Token()
	if err != nil {
		return newError(http.StatusBadRequest, "malformed_json", describeJSONError(err))
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if tok == nil {
		if path == "" {
			return newError(http.StatusBadRequest, "invalid_type", "The body is null: it must be a JSON object.")
		}
		return nil // as if the field were left out: the rules say whether it may be
	}
	if want := jsonTypeOf(t); want != jsonTypeOfToken(tok) {
		return wrongType(path, want, jsonTypeOfToken(tok))
	}
	switch v := tok.(type) {
	case json.Delim:
		if v == '{' {
			if err := checkObject(dec, t, path); err != nil {
				return err
			}
		} else {
			for i := 0; dec.More(); i++ {
				if err := checkValue(dec, t.Elem(), fmt.Sprintf("%s[%d]", path, i)); err != nil {
					return err
				}
			}
		}
		_, err := dec.Token() // the closing delimiter
		return err
	case json.Number:
		if t.Kind() == reflect.Float32 || t.Kind() == reflect.Float64 {
			return nil
		}
		// As encoding/json reads an integer: digits only, within range.
		if _, err := strconv.ParseInt(v.String(), 10, t.Bits()); errors.Is(err, strconv.ErrRange) {
			return newError(http.StatusBadRequest, "invalid_type", fmt.Sprintf("%s is out of range: %s.", fieldName(path), shorten(v.String())))
		} else if err != nil {
			return newError(http.StatusBadRequest, "invalid_type",
				fmt.Sprintf("%s must be a whole number, without a fraction or an exponent, not %s.", fieldName(path), shorten(v.String())))
		}
	}
	return nil
}

// shorten cuts a value the caller sent to a length a detail can quote.
func shorten(s string) string {
	const limit = 32
	if len(s) <= limit {
		return s
	}
	return s[:limit] + "…"
}

// checkObject checks the keys and values of an object whose "{" dec has
// read, up to its "}".
func checkObject(dec *json.Decoder, t reflect.Type, path string) error {
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
	seen := make(map[string]bool, len(fields))
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return newError(http.StatusBadRequest, "malformed_json", describeJSONError(err))
		}
		key, _ := tok.(string)
		field := key
		if path != "" {
			field = path + "." + key
		}
		ft, ok := fields[key]
		switch {
		case !ok:
			return newError(http.StatusBadRequest, "malformed_json",
				fmt.Sprintf("Unknown field %q: field names are case-sensitive.", field))
		case seen[key]:
			return newError(http.StatusBadRequest, "malformed_json",
				fmt.Sprintf("Field %q is given twice: each field may appear once.", field))
		}
		seen[key] = true
		if err := checkValue(dec, ft, field); err != nil {
			return err
		}
	}
	return nil
}

// jsonTypeOf is the JSON type a value of Go type t (not a pointer) is
// written as.
func jsonTypeOf(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Struct, reflect.Map:
		return "object"
	case reflect.Slice, reflect.Array:
		return "array"
	case reflect.String:
		return "string"
	case reflect.Bool:
		return "boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64, reflect.Float32, reflect.Float64:
		return "number"
	}
	return "value of Go type " + t.String() // no request type has one: a test of it fails
}

// jsonTypeOfToken is the JSON type of the value a token begins.
func jsonTypeOfToken(tok json.Token) string {
	switch v := tok.(type) {
	case json.Delim:
		if v == '{' {
			return "object"
		}
		return "array"
	case string:
		return "string"
	case json.Number:
		return "number"
	case bool:
		return "boolean"
	}
	return "null"
}

// wrongType is the 400 of a value of JSON type got where want belongs.
func wrongType(path, want, got string) error {
	return newError(http.StatusBadRequest, "invalid_type",
		fmt.Sprintf("%s must be a JSON %s, not %s %s.", fieldName(path), want, article(got), got))
}

// fieldName names the place of a value: "The body", or "Field items[0].sku".
func fieldName(path string) string {
	if path == "" {
		return "The body"
	}
	return "Field " + path
}

func article(word string) string {
	if strings.ContainsRune("aeiou", rune(word[0])) {
		return "an"
	}
	return "a"
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
		return fmt.Sprintf("%s must be a JSON %s.", fieldName(typeErr.Field), jsonTypeOf(typeErr.Type))
	case errors.Is(err, io.EOF):
		return "The body is empty."
	case errors.Is(err, io.ErrUnexpectedEOF):
		return "The body ends in the middle of a JSON value."
	}
	return "The body is not valid JSON."
}
