package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"
)

// maxBodyBytes caps a request body (docs/contract.md: 64 KiB, else 413).
const maxBodyBytes = 64 << 10

// decodeJSON reads the body of c into dst, strictly: the content type must
// be JSON (415), the body at most 64 KiB (413), the JSON well formed with no
// unknown field and nothing after it (400).
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
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		return newError(http.StatusBadRequest, "malformed_json", describeJSONError(err))
	}
	if dec.More() {
		return newError(http.StatusBadRequest, "malformed_json", "The body holds more than one JSON value.")
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
