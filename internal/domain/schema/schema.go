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
// order service's consumers check every payload against them (Validate, as
// inbox.Config.ValidateBody) before they decode it, so that a message that
// breaks its schema is parked as schema_violation with the place and the
// reason.
//
// The schema and the decoders read the same bytes the same way. Where
// encoding/json would read a payload otherwise than JSON Schema does, the
// schema or the decoder refuses it:
//   - a key that names a field only when case is ignored ("ORDER_ID" beside
//     order_id: encoding/json reads it into order_id, a case-sensitive
//     reader ignores it) breaks the schema (exactNames), and
//     domain.DecodeMessage refuses it too;
//   - an integer spelled as a fraction or with an exponent (2.0, 2e0) is an
//     integer to JSON Schema, which no schema can tell from 2; encoding/json
//     refuses it for a Go integer, so the decoder parks it as
//     malformed_message: the one payload the schema lets through and a
//     consumer refuses.
package schema

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"

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
	Pattern     string      `json:"pattern,omitempty"`
	Enum        []string    `json:"enum,omitempty"`
	Properties  Properties  `json:"properties,omitempty"`
	Required    []string    `json:"required,omitempty"`
	// PropertyNames, of an object, holds each key to a schema: here, that a
	// key which names a property when case is ignored names it exactly.
	PropertyNames *Schema `json:"propertyNames,omitempty"`
	Items         *Schema `json:"items,omitempty"`
	Not           *Schema `json:"not,omitempty"`
	Const         any     `json:"const,omitempty"`
	If            *Schema `json:"if,omitempty"`
	Then          *Schema `json:"then,omitempty"`
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
	s.PropertyNames = exactNames(s.Properties)
	return s, nil
}

// exactNames is the propertyNames schema of an object with properties ps:
// a key that matches the name of one of them when case is ignored must be
// that name. encoding/json matches keys to fields so ("ORDER_ID" fills
// order_id), a case-sensitive reader takes such a key for an unknown one,
// and the two would read different payloads from the same bytes; with
// this, every reader refuses it. Case is ignored as encoding/json ignores
// it, by Unicode simple folding (so "ſku", with a long s, is "sku"), and
// the pattern spells each letter's foldings out ("[sSſ][kKK][uU]") rather
// than use a flag, which JSON Schema's regular expressions do not have.
func exactNames(ps Properties) *Schema {
	if len(ps) == 0 {
		return nil
	}
	var names, alternatives []string
	for _, p := range ps {
		names = append(names, p.Name)
		alternatives = append(alternatives, caseless(p.Name))
	}
	return &Schema{
		If:   &Schema{Pattern: "^(?:" + strings.Join(alternatives, "|") + ")$"},
		Then: &Schema{Enum: names},
	}
}

// caseless is a regular expression that matches name in any case: each
// letter as the class of its simple case foldings.
func caseless(name string) string {
	var b strings.Builder
	for _, r := range name {
		class := []rune{r}
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			class = append(class, f)
		}
		if len(class) == 1 {
			b.WriteString(regexp.QuoteMeta(string(r)))
			continue
		}
		slices.Sort(class)
		b.WriteString("[" + string(class) + "]")
	}
	return b.String()
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
		return fmt.Errorf("%w: %s v%d does not match its schema: %s", domain.ErrMalformedMessage, typ, version, violations(ve, doc))
	}
	if err != nil {
		return fmt.Errorf("%w: %s v%d: %w", domain.ErrMalformedMessage, typ, version, err)
	}
	return nil
}

// violations lists the innermost failures of ve, each with the place in
// the payload doc where it is, on one line, sorted.
func violations(ve *jsonschema.ValidationError, doc any) string {
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
		if _, ok := u.Error.Kind.(*kind.PropertyNames); !ok && strings.Contains(u.KeywordLocation, "/propertyNames/") {
			continue // the failure of a key, which its parent unit says
		}
		at := u.InstanceLocation
		if at == "" {
			at = "/"
		}
		what := u.Error.String()
		// The words name the place and the rule, never the value found
		// there: they become a parked message's parked_reason and its inbox
		// row's last_error_message, which carry no payload data.
		switch k := u.Error.Kind.(type) {
		case *kind.Format:
			what = "not a valid " + k.Want
		case *kind.Minimum:
			what = "below the minimum " + k.Want.RatString()
		case *kind.Maximum:
			what = "above the maximum " + k.Want.RatString()
		case *kind.Enum, *kind.Const:
			what = "not an allowed value"
		case *kind.Pattern:
			what = "does not match the pattern"
		case *kind.Not:
			what = "the nil UUID is no id" // the only "not" of the schemas (of)
		case *kind.PropertyNames:
			// The only propertyNames of the schemas (exactNames): its
			// enum names the property the key was meant for. The key is a
			// field's name in another case, not data. The
			// validator's instance location of a key is not to be
			// trusted (it shares the slice it keeps appending to), so
			// the key is looked for where the keyword says.
			what = fmt.Sprintf("key %q is %q in another case: keys are case-sensitive", k.Property, meant(units[i+1:], k.Property))
			for _, at := range holding(doc, u.KeywordLocation, k.Property) {
				out = append(out, fmt.Sprintf("at %s: %s", at, what))
			}
			continue
		}
		out = append(out, fmt.Sprintf("at %s: %s", at, what))
	}
	slices.Sort(out) // the validator's order varies from run to run
	return strings.Join(slices.Compact(out), "; ")
}

// holding lists the places in doc of the objects that have key and that
// the propertyNames keyword at keywordLocation applies to
// ("/properties/items/items/propertyNames/...": each element of items).
func holding(doc any, keywordLocation, key string) []string {
	type node struct {
		at string
		v  any
	}
	nodes := []node{{"", doc}}
	tokens := strings.Split(strings.TrimPrefix(keywordLocation, "/"), "/")
	for i := 0; i < len(tokens) && tokens[i] != "propertyNames"; i++ {
		var next []node
		for _, n := range nodes {
			switch tokens[i] {
			case "properties":
				if obj, ok := n.v.(map[string]any); ok && i+1 < len(tokens) {
					if v, ok := obj[tokens[i+1]]; ok {
						next = append(next, node{n.at + "/" + tokens[i+1], v})
					}
				}
			case "items":
				if arr, ok := n.v.([]any); ok {
					for j, v := range arr {
						next = append(next, node{fmt.Sprintf("%s/%d", n.at, j), v})
					}
				}
			}
		}
		if tokens[i] == "properties" {
			i++ // the property's name
		}
		nodes = next
	}
	var out []string
	for _, n := range nodes {
		if obj, ok := n.v.(map[string]any); ok {
			if _, ok := obj[key]; ok {
				out = append(out, cmp.Or(n.at, "/"))
			}
		}
	}
	return out
}

// meant is the property name that key spells in another case, as the enum
// of the propertyNames failure that follows it among units lists it.
func meant(units []jsonschema.OutputUnit, key string) string {
	for _, u := range units {
		if u.Error == nil {
			continue
		}
		if e, ok := u.Error.Kind.(*kind.Enum); ok {
			for _, name := range e.Want {
				if name, ok := name.(string); ok && strings.EqualFold(name, key) {
					return name
				}
			}
		}
	}
	return "a property"
}
