// Package httpapi is the HTTP API of order-api (docs/contract.md): create,
// read, list and cancel orders, health and readiness, and the OpenAPI
// document. It is the producer end of the outbox: each write commits the
// order change and its outbox row in one transaction, visible in the
// handlers as pgx.BeginFunc.
//
// Every route under /v1/ and /ui/ needs a caller with a verified bearer
// token (Deps.Verifier); a customer sees and changes its own orders only
// (authn.go).
//
// Errors are application/problem+json (RFC 9457), written by one error
// handler (problem.go) from the errors the handlers return.
//
// Under overload the API answers 503 with Retry-After rather than queue:
// a request waits at most Config.AcquireTimeout for a database connection
// (pool.go), and at most Config.MaxInFlight requests are handled at once
// (limitInFlight).
package httpapi
