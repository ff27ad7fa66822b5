package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/yourorg/orders/internal/auth"
)

// tokenReport is a development token: the bearer token order-api accepts
// for a customer or an operator.
type tokenReport struct {
	Token     string    `json:"token"`
	Subject   string    `json:"sub"`
	Role      auth.Role `json:"role"`
	ExpiresAt time.Time `json:"expires_at"`
}

// devOperatorPrefix begins the sub of an operator's development token.
const devOperatorPrefix = "dev-operator:"

// human prints the token alone, so that TOKEN=$(orderctl token ...) works.
func (r tokenReport) human(w io.Writer) { _, _ = fmt.Fprintln(w, r.Token) }

// token mints an HS256 token with the API's secret (API_JWT_SECRET, and
// API_JWT_ISSUER, API_JWT_AUDIENCE when set), for a customer (-customer ID)
// or an operator (-operator), valid for -ttl. It needs no database: it is
// run before anything connects. An operator's sub says what the token is
// and who asked for it: devOperatorPrefix and the operator's name
// (ORDERCTL_USER, else the OS user), dev-operator:alice, so that the
// timeline page does not show a bare "root" as the one signed in.
//
// These are development tokens: whoever holds API_JWT_SECRET can mint any
// token. Where an identity provider issues the tokens, order-api verifies
// them with API_JWT_PUBLIC_KEYS and this command is not used.
//
// Note that orderctl itself does not go through the API's rules: it works
// on the database and the broker directly, with the access of its
// DATABASE_URL and AMQP_URL, which are what let an operator use it.
func token(_ context.Context, c *ctl) (report, error) {
	p := auth.Principal{Subject: c.args.customer, Role: auth.RoleCustomer}
	if c.args.operator {
		p = auth.Principal{Subject: devOperatorPrefix + c.user, Role: auth.RoleOperator} // ORDERCTL_USER, else the OS user
	}
	signed, err := auth.Mint([]byte(c.cfg.JWTSecret), p, c.args.ttl, c.cfg.JWTIssuer, c.cfg.JWTAudience)
	if err != nil {
		return nil, fmt.Errorf("token: API_JWT_SECRET: %w", err)
	}
	return tokenReport{Token: signed, Subject: p.Subject, Role: p.Role, ExpiresAt: time.Now().Add(c.args.ttl).UTC().Truncate(time.Second)}, nil
}

// checkToken checks the flags of `orderctl token` and the secret.
func checkToken(a args, secret string) error {
	switch {
	case secret == "":
		return errors.New("token: API_JWT_SECRET is not set: the token is signed with order-api's HS256 secret (make token sets the development one)")
	case a.operator && a.customer != "":
		return errors.New("token: -customer ID or -operator, not both")
	case !a.operator && a.customer == "":
		return errors.New("token: want -customer ID or -operator")
	case a.ttl <= 0:
		return fmt.Errorf("token: -ttl must be positive, got %v", a.ttl)
	}
	return nil
}
