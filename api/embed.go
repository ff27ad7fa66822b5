// Package api holds the OpenAPI 3 document of the HTTP API. order-api
// serves it at GET /openapi.yaml, and the API tests check every route and
// every response against it.
package api

import _ "embed"

// OpenAPI is openapi.yaml.
//
//go:embed openapi.yaml
var OpenAPI []byte
