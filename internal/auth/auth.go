// Package auth decides who is calling order-api: it verifies a JWT bearer
// token (github.com/golang-jwt/jwt/v5) into a Principal, the customer or
// operator the token names. What a principal may do is decided by the
// handlers (internal/httpapi), with the Principal's methods below; how a
// token reaches the API (the Authorization header, the /ui/ cookie) is
// internal/httpapi's too.
//
// A token is accepted when it is signed with one of the configured keys by
// an algorithm those keys can verify (never "none"), has not expired (exp
// is required), and names the configured issuer and audience when those
// are set. Its claims:
//
//	sub   the caller: the customer id of a customer, the operator's name
//	role  "customer" (the default when absent) or "operator"
package auth

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// Role is what a caller may do.
type Role string

// The roles a token may name.
const (
	// RoleCustomer sees and changes its own orders only: those whose
	// customer_id is its sub.
	RoleCustomer Role = "customer"
	// RoleOperator sees and cancels every order.
	RoleOperator Role = "operator"
)

// Principal is the verified caller of a request.
type Principal struct {
	// Subject is the token's sub: the customer id of a customer.
	Subject string
	Role    Role
}

// Operator reports whether p may see and change every order.
func (p Principal) Operator() bool { return p.Role == RoleOperator }

// Owns reports whether p may see and change the orders of customerID:
// its own, or anyone's for an operator.
func (p Principal) Owns(customerID string) bool {
	return p.Operator() || p.Subject == customerID
}

// Claims are the claims of a token this package reads and mints.
type Claims struct {
	jwt.RegisteredClaims
	// Role is "customer" or "operator"; empty means customer.
	Role Role `json:"role,omitempty"`
}

// Leeway is the clock skew allowed between the token's issuer and this
// process, on exp, nbf and iat.
const Leeway = 30 * time.Second

// MinSecretLen is the shortest HS256 secret accepted: 32 bytes, the size
// of the HMAC-SHA256 output, as RFC 7518 (section 3.2) requires.
const MinSecretLen = 32

// ErrForbidden is a valid token whose role is none of the Roles: the
// caller is known, and may do nothing (403).
var ErrForbidden = errors.New("the token's role is neither customer nor operator")

// Refusal is why a token was refused: a short, fixed reason for logs and
// metrics (never the token), and whether the answer is 403 rather than 401.
type Refusal struct {
	Reason string // missing, malformed, bad_signature, expired, ...
	err    error
}

// Refuse returns the Refusal of reason, for a token refused before
// Verify: missing, or not in a bearer header.
func Refuse(reason string, err error) *Refusal { return &Refusal{Reason: reason, err: err} }

func (r *Refusal) Error() string {
	if r.err == nil {
		return r.Reason
	}
	return r.Reason + ": " + r.err.Error()
}
func (r *Refusal) Unwrap() error { return r.err }

// Forbidden reports whether the token was valid but its role is unknown.
func (r *Refusal) Forbidden() bool { return errors.Is(r.err, ErrForbidden) }

// Options configure a Verifier. At least one of Secret and PublicKeysPEM.
type Options struct {
	// Secret verifies HS256 tokens (at least MinSecretLen bytes).
	Secret []byte
	// PublicKeysPEM holds PEM blocks, each a public key (PUBLIC KEY, RSA
	// PUBLIC KEY) or a certificate: RSA (RS256/384/512, PS256/384/512),
	// ECDSA P-256, P-384 or P-521 (ES256, ES384, ES512) and Ed25519 (EdDSA).
	// A token is accepted when any key of its algorithm verifies it.
	PublicKeysPEM []byte
	// Issuer and Audience, when set, must be the token's iss and one of
	// its aud. Audience is required with PublicKeysPEM: an identity
	// provider signs the tokens of every client it serves with the same
	// keys, and only the audience tells the tokens meant for this API from
	// those it issued for another application.
	Issuer, Audience string
	// Now is the clock (time.Now when nil); tests move it.
	Now func() time.Time
}

// Verifier turns bearer tokens into Principals.
type Verifier struct {
	off    bool
	parser *jwt.Parser
	keys   map[string][]any // algorithm -> the keys that verify it
}

// Off returns a Verifier that treats every caller as an anonymous operator:
// for local experiments and black-box tests only. It must be asked for:
// there is no zero value that lets everyone in.
func Off() *Verifier { return &Verifier{off: true} }

// IsOff reports whether v is Off.
func (v *Verifier) IsOff() bool { return v.off }

// NewVerifier returns a Verifier that accepts the tokens signed with the
// keys of o, and only by algorithms those keys can verify.
func NewVerifier(o Options) (*Verifier, error) {
	keys := map[string][]any{}
	if len(o.Secret) > 0 {
		if len(o.Secret) < MinSecretLen {
			return nil, fmt.Errorf("the HS256 secret is %d bytes, want at least %d", len(o.Secret), MinSecretLen)
		}
		keys[jwt.SigningMethodHS256.Alg()] = []any{o.Secret}
	}
	if len(o.PublicKeysPEM) > 0 {
		if o.Audience == "" {
			return nil, errors.New("an identity provider's public keys need an audience: " +
				"without one, every token the provider issued for any of its clients would be accepted")
		}
		public, err := ParsePublicKeys(o.PublicKeysPEM)
		if err != nil {
			return nil, err
		}
		for _, k := range public {
			for _, alg := range algorithms(k) {
				keys[alg] = append(keys[alg], k)
			}
		}
	}
	if len(keys) == 0 {
		return nil, errors.New("no key to verify tokens with: give a secret or public keys")
	}
	opts := []jwt.ParserOption{
		jwt.WithValidMethods(slices.Sorted(maps.Keys(keys))),
		jwt.WithExpirationRequired(),
		jwt.WithLeeway(Leeway),
		jwt.WithIssuedAt(),
	}
	if o.Issuer != "" {
		opts = append(opts, jwt.WithIssuer(o.Issuer))
	}
	if o.Audience != "" {
		opts = append(opts, jwt.WithAudience(o.Audience))
	}
	if o.Now != nil {
		opts = append(opts, jwt.WithTimeFunc(o.Now))
	}
	return &Verifier{parser: jwt.NewParser(opts...), keys: keys}, nil
}

// Algorithms lists the algorithms v accepts, sorted.
func (v *Verifier) Algorithms() []string { return slices.Sorted(maps.Keys(v.keys)) }

// Verify checks token and returns its caller. The error is a *Refusal.
func (v *Verifier) Verify(token string) (Principal, error) {
	if v.off {
		return Principal{Role: RoleOperator}, nil
	}
	var claims Claims
	_, err := v.parser.ParseWithClaims(token, &claims, func(t *jwt.Token) (any, error) {
		// Only the keys of the token's algorithm: an RSA public key is
		// never tried as an HMAC secret. WithValidMethods has refused
		// every other algorithm already.
		keys := v.keys[t.Method.Alg()]
		set := jwt.VerificationKeySet{Keys: make([]jwt.VerificationKey, len(keys))}
		for i, k := range keys {
			set.Keys[i] = k
		}
		return set, nil
	})
	if err != nil {
		return Principal{}, &Refusal{Reason: reason(err), err: err}
	}
	if claims.Subject == "" {
		return Principal{}, &Refusal{Reason: "invalid_claims", err: errors.New("the token has no sub")}
	}
	p := Principal{Subject: claims.Subject, Role: claims.Role}
	switch p.Role {
	case "":
		p.Role = RoleCustomer
	case RoleCustomer, RoleOperator:
	default:
		return Principal{}, &Refusal{Reason: "unknown_role", err: fmt.Errorf("%w: %q", ErrForbidden, claims.Role)}
	}
	return p, nil
}

// Reasons are every Refusal's Reason: a fixed set, for metric labels.
var Reasons = []string{
	"missing", "malformed", "bad_signature", "expired", "not_yet_valid",
	"wrong_issuer", "wrong_audience", "invalid_claims", "unknown_role",
}

// reason names a parse error of jwt for logs and metrics: one of Reasons.
func reason(err error) string {
	switch {
	case errors.Is(err, jwt.ErrTokenMalformed):
		return "malformed"
	case errors.Is(err, jwt.ErrTokenSignatureInvalid), errors.Is(err, jwt.ErrTokenUnverifiable):
		return "bad_signature" // a wrong key, or an algorithm not accepted (none included)
	case errors.Is(err, jwt.ErrTokenExpired):
		return "expired"
	case errors.Is(err, jwt.ErrTokenNotValidYet), errors.Is(err, jwt.ErrTokenUsedBeforeIssued):
		return "not_yet_valid"
	case errors.Is(err, jwt.ErrTokenInvalidIssuer):
		return "wrong_issuer"
	case errors.Is(err, jwt.ErrTokenInvalidAudience):
		return "wrong_audience"
	default:
		return "invalid_claims" // no exp, a claim of the wrong type
	}
}

// ParsePublicKeys reads every PEM block of raw: PUBLIC KEY (PKIX: RSA,
// ECDSA, Ed25519), RSA PUBLIC KEY (PKCS #1) or CERTIFICATE (its key).
// Anything else, or no key at all, is an error.
func ParsePublicKeys(raw []byte) ([]any, error) {
	var keys []any
	for n := 1; ; n++ {
		var block *pem.Block
		block, raw = pem.Decode(raw)
		if block == nil {
			break
		}
		key, err := parsePublicKey(block)
		if err != nil {
			return nil, fmt.Errorf("PEM block %d (%s): %w", n, block.Type, err)
		}
		if len(algorithms(key)) == 0 {
			return nil, fmt.Errorf("PEM block %d (%s): a %T cannot verify a JWT algorithm", n, block.Type, key)
		}
		keys = append(keys, key)
	}
	if len(keys) == 0 {
		return nil, errors.New("no PEM block of a public key")
	}
	return keys, nil
}

func parsePublicKey(block *pem.Block) (any, error) {
	switch block.Type {
	case "PUBLIC KEY":
		return x509.ParsePKIXPublicKey(block.Bytes)
	case "RSA PUBLIC KEY":
		return x509.ParsePKCS1PublicKey(block.Bytes)
	case "CERTIFICATE":
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, err
		}
		return cert.PublicKey, nil
	default:
		return nil, errors.New("not a public key or a certificate (a private key does not belong here)")
	}
}

// algorithms lists the JWT algorithms a public key verifies.
func algorithms(key any) []string {
	switch k := key.(type) {
	case *rsa.PublicKey:
		return []string{"RS256", "RS384", "RS512", "PS256", "PS384", "PS512"}
	case *ecdsa.PublicKey:
		switch k.Curve {
		case elliptic.P256():
			return []string{"ES256"}
		case elliptic.P384():
			return []string{"ES384"}
		case elliptic.P521():
			return []string{"ES512"}
		}
	case ed25519.PublicKey:
		return []string{"EdDSA"}
	}
	return nil
}

// Mint signs an HS256 token for p, valid for ttl from now, with issuer and
// audience when set: the development tokens of `orderctl token`, and the
// tokens of the tools and tests that start their own API.
func Mint(secret []byte, p Principal, ttl time.Duration, issuer, audience string) (string, error) {
	if len(secret) < MinSecretLen {
		return "", fmt.Errorf("the HS256 secret is %d bytes, want at least %d", len(secret), MinSecretLen)
	}
	now := time.Now()
	claims := Claims{
		RegisteredClaims: jwt.RegisteredClaims{
			Subject:   p.Subject,
			Issuer:    issuer,
			IssuedAt:  jwt.NewNumericDate(now),
			ExpiresAt: jwt.NewNumericDate(now.Add(ttl)),
		},
		Role: p.Role,
	}
	if audience != "" {
		claims.Audience = jwt.ClaimStrings{audience}
	}
	return jwt.NewWithClaims(jwt.SigningMethodHS256, claims).SignedString(secret)
}

// ClientTokenTTL is how long the token ClientToken mints is valid: longer
// than any run of the tools that use it.
const ClientTokenTTL = 12 * time.Hour

// ClientToken is the bearer token of a client the project ships
// (walkthrough, loadgen), from its environment: API_TOKEN when set; else,
// where it holds the API's secret (make dev; the compose demo, in the file
// of API_JWT_SECRET_FILE), an operator token it mints with API_JWT_SECRET,
// API_JWT_ISSUER and API_JWT_AUDIENCE; else "" (for an API with
// API_AUTH=off).
func ClientToken(getenv func(string) string) (string, error) {
	if token := getenv("API_TOKEN"); token != "" {
		return token, nil
	}
	secret := getenv("API_JWT_SECRET")
	if file := getenv("API_JWT_SECRET_FILE"); secret == "" && file != "" {
		raw, err := os.ReadFile(file)
		if err != nil {
			return "", fmt.Errorf("API_JWT_SECRET_FILE: %w", err)
		}
		secret = strings.TrimRight(string(raw), "\r\n")
	}
	if secret == "" {
		return "", nil
	}
	token, err := Mint([]byte(secret), Principal{Subject: "dev-operator", Role: RoleOperator}, ClientTokenTTL,
		getenv("API_JWT_ISSUER"), getenv("API_JWT_AUDIENCE"))
	if err != nil {
		return "", fmt.Errorf("API_JWT_SECRET: %w", err)
	}
	return token, nil
}
