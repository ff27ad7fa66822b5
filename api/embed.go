// Package api holds the contracts of the service for other teams' tools.
//
// openapi.yaml is the OpenAPI 3 document of the HTTP API. The API tests
// and the end-to-end tests send their HTTP traffic through
// api/apicheck, which checks every request and every answer
// against it; redocly lint checks the document itself (.ci/run).
//
// asyncapi.yaml is the AsyncAPI 3 document of the messages: the exchange,
// each message type and version with its payload's JSON Schema, the
// consumers' queues. It is generated, with docs/catalog.md, by the
// directive below (`go generate ./api`, or `make generate`), and a test
// fails when it is stale; asyncapi validate checks it (.ci/run).
//
// order-api serves both, at GET /openapi.yaml and GET /asyncapi.yaml.
package api

import _ "embed"

//go:generate go run ./internal/gen -asyncapi asyncapi.yaml -catalog ../docs/catalog.md

// OpenAPI is openapi.yaml.
//
//go:embed openapi.yaml
var OpenAPI []byte

// AsyncAPI is asyncapi.yaml.
//
//go:embed asyncapi.yaml
var AsyncAPI []byte
