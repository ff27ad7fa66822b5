// Package schema holds the JSON Schemas of the message payloads of the
// domain's catalogue (internal/domain/messages.go), and validates payloads
// against them.
//
// The schemas are not written by hand: each is derived by reflection from
// the Go type that encodes and decodes the payload, so that the two cannot
// disagree. A field is required unless its json tag has omitempty (the
// producers always write it, so a reader may count on it); a uuid.UUID is
// a string of format uuid; unknown fields are allowed, because readers
// ignore them and a producer may add optional ones (docs/messaging.md).
// api/asyncapi.yaml publishes the same schemas for other teams; the
// consumers' decoder is to check every payload against them (Validate)
// before it decodes it, so that a message that breaks its schema is
// parked with the reason.
//
// domain.DecodeMessage refuses two kinds of payload that the schemas let
// through, where encoding/json would read them otherwise than JSON Schema
// does: an integer spelled as a fraction or with an exponent (2.0, 2e0:
// an integer to JSON Schema, which no schema can tell from 2), and a key
// that names a field only when case is ignored ("Order_Id": an unknown
// field to JSON Schema, order_id to encoding/json).
package schema

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"

	"github.com/yourorg/orders/internal/domain"
)

// Schema is a JSON Schema, of the subset the payloads need. The keywords
// mean the same in JSON Schema draft 7 (the dialect of AsyncAPI's schemas)
// and in 2020-12.
type Schema struct {
	Title       string      `json:"title,omitempty"`
	Description string      `json:"description,omitempty"`
	Type        string      `json:"type,omitempty"`
	Format      string      `json:"format,omitempty"`
	Minimum     json.Number `json:"minimum,omitempty"`
	Maximum     json.Number `json:"maximum,omitempty"`
	Properties  Properties  `json:"properties,omitempty"`
	Required    []string    `json:"required,omitempty"`
	Items       *Schema     `json:"items,omitempty"`
	Not         *Schema     `json:"not,omitempty"`
	Const       any         `json:"const,omitempty"`
}

// Properties are the properties of an object schema, in the order of the
// Go struct's fields.
type Properties []Property

// Property is one property of an object schema.
type Property struct {
	Name   string
	Schema *Schema
}

// MarshalJSON writes the properties as a JSON object, in their order.
func (ps Properties) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, p := range ps {
		if i > 0 {
			b.WriteByte(',')
		}
		name, err := json.Marshal(p.Name)
		if err != nil {
			return nil, err
		}
		s, err := json.Marshal(p.Schema)
		if err != nil {
			return nil, err
		}
		b.Write(name)
		b.WriteByte(':')
		b.Write(s)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

var (
	uuidType = reflect.TypeFor[uuid.UUID]()
	timeType = reflect.TypeFor[time.Time]()
)

// Of derives the schema of the payload of m's Go type.
func Of(m domain.Message) (*Schema, error) {
	s, err := of(reflect.TypeOf(m), reflect.TypeOf(m).Name())
	if err != nil {
		return nil, err
	}
	s.Title = fmt.Sprintf("%s, version %d", m.MessageType(), m.MessageVersion())
	return s, nil
}

// of is the schema of Go type t, found at path (for the errors).
func of(t reflect.Type, path string) (*Schema, error) {
	switch t {
	case uuidType:
		// Every id of the domain is a real one (a version 7 UUID): the nil
		// UUID is a missing id (domain.DecodeMessage says so of order_id).
		return &Schema{Type: "string", Format: "uuid", Not: &Schema{Const: uuid.Nil.String()}}, nil
	case timeType:
		return &Schema{Type: "string", Format: "date-time"}, nil
	}
	switch t.Kind() {
	case reflect.String:
		return &Schema{Type: "string"}, nil
	case reflect.Bool:
		return &Schema{Type: "boolean"}, nil
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		// The range of the Go type: a larger number does not decode.
		return &Schema{Type: "integer",
			Minimum: json.Number(strconv.FormatInt(math.MinInt64>>(64-t.Bits()), 10)),
			Maximum: json.Number(strconv.FormatInt(math.MaxInt64>>(64-t.Bits()), 10))}, nil
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return &Schema{Type: "integer", Minimum: "0",
			Maximum: json.Number(strconv.FormatUint(math.MaxUint64>>(64-t.Bits()), 10))}, nil
	case reflect.Float32, reflect.Float64:
		return &Schema{Type: "number"}, nil
	case reflect.Slice:
		if t.Elem().Kind() == reflect.Uint8 {
			break // []byte: base64 in JSON, not an array
		}
		items, err := of(t.Elem(), path+"[]")
		if err != nil {
			return nil, err
		}
		return &Schema{Type: "array", Items: items}, nil
	case reflect.Struct:
		return object(t, path)
	}
	// A pointer, a map, an interface, []byte: no payload has one yet. Teach
	// this function the JSON encoding/json gives it before using one.
	return nil, fmt.Errorf("schema: %s is a %s, which the payload schemas do not describe yet", path, t)
}

// object is the schema of struct type t: its exported fields, named and
// made optional by their json tags as encoding/json does.
func object(t reflect.Type, path string) (*Schema, error) {
	s := &Schema{Type: "object"}
	for f := range t.Fields() {
		if !f.IsExported() {
			continue
		}
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		if f.Anonymous {
			return nil, fmt.Errorf("schema: %s.%s is embedded, which the payload schemas do not describe yet", path, f.Name)
		}
		name, opts, _ := strings.Cut(tag, ",")
		if name == "" {
			name = f.Name
		}
		prop, err := of(f.Type, path+"."+f.Name)
		if err != nil {
			return nil, err
		}
		s.Properties = append(s.Properties, Property{Name: name, Schema: prop})
		if !hasOption(opts, "omitempty") && !hasOption(opts, "omitzero") {
			s.Required = append(s.Required, name)
		}
	}
	return s, nil
}

func hasOption(opts, want string) bool {
	for o := range strings.SplitSeq(opts, ",") {
		if o == want {
			return true
		}
	}
	return false
}

// key names one version of one message type.
type key struct {
	typ     string
	version int
}

// compiled holds the schema of every (type, version) of the catalogue,
// derived and compiled once.
var compiled = sync.OnceValues(func() (map[key]*jsonschema.Schema, error) {
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft7)
	c.AssertFormat() // a malformed uuid is a violation, not a note
	out := map[key]*jsonschema.Schema{}
	for _, m := range domain.Examples() {
		s, err := Of(m)
		if err != nil {
			return nil, err
		}
		raw, err := json.Marshal(s)
		if err != nil {
			return nil, err
		}
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
		if err != nil {
			return nil, err
		}
		url := fmt.Sprintf("urn:orders:message:%s:v%d", m.MessageType(), m.MessageVersion())
		if err := c.AddResource(url, doc); err != nil {
			return nil, err
		}
		if out[key{m.MessageType(), m.MessageVersion()}], err = c.Compile(url); err != nil {
			return nil, fmt.Errorf("schema of %s v%d: %w", m.MessageType(), m.MessageVersion(), err)
		}
	}
	return out, nil
})

// Validate checks body, the payload of a message of type typ and version,
// against its schema. The error names every violation with its place in
// the payload ("at /items/0/quantity: got string, want integer"); it wraps
// domain.ErrMalformedMessage, or domain.ErrUnknownMessageType or
// domain.ErrUnsupportedVersion when the catalogue has no such message, as
// domain.DecodeMessage's do.
func Validate(typ string, version int, body []byte) error {
	schemas, err := compiled()
	if err != nil {
		return err
	}
	s, ok := schemas[key{typ, version}]
	if !ok {
		if domain.KnownMessageType(typ) {
			return fmt.Errorf("%w: %s version %d", domain.ErrUnsupportedVersion, typ, version)
		}
		return fmt.Errorf("%w: %q", domain.ErrUnknownMessageType, typ)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("%w: %s v%d: the payload is not one JSON value: %w", domain.ErrMalformedMessage, typ, version, err)
	}
	err = s.Validate(doc)
	var ve *jsonschema.ValidationError
	if errors.As(err, &ve) {
		return fmt.Errorf("%w: %s v%d does not match its schema: %s", domain.ErrMalformedMessage, typ, version, violations(ve))
	}
	if err != nil {
		return fmt.Errorf("%w: %s v%d: %w", domain.ErrMalformedMessage, typ, version, err)
	}
	return nil
}

// violations lists the innermost failures of ve, each with the place in
// the payload where it is, on one line, sorted.
func violations(ve *jsonschema.ValidationError) string {
	units := ve.BasicOutput().Errors
	var out []string
	for i, u := range units {
		if u.Error == nil {
			continue
		}
		// A unit whose keyword holds a later unit's only sums it up
		// ("validation failed"): the later one says what failed.
		parent := false
		for _, later := range units[i+1:] {
			if strings.HasPrefix(later.KeywordLocation, u.KeywordLocation+"/") {
				parent = true
				break
			}
		}
		if parent {
			continue
		}
		at := u.InstanceLocation
		if at == "" {
			at = "/"
		}
		what := u.Error.String()
		if _, ok := u.Error.Kind.(*kind.Not); ok {
			what = "the nil UUID is no id" // the only "not" of the schemas (of)
		}
		out = append(out, fmt.Sprintf("at %s: %s", at, what))
	}
	slices.Sort(out) // the validator's order varies from run to run
	return strings.Join(out, "; ")
}
