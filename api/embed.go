// Package api holds the OpenAPI 3 document of the HTTP API. order-api
// serves it at GET /openapi.yaml. The API tests and the end-to-end tests
// send their HTTP traffic through internal/testenv/apicheck, which checks
// every request and every answer against it; redocly lint checks the
// document itself (.ci/run).
package api

import _ "embed"

// OpenAPI is openapi.yaml.
//
//go:embed openapi.yaml
var OpenAPI []byte
