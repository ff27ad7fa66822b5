package auth_test

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/yourorg/orders/internal/auth"
)

var secret = []byte("0123456789abcdef0123456789abcdef")

func pemOf(t *testing.T, typ string, der []byte) []byte {
	t.Helper()
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

func pkixPEM(t *testing.T, pub any) []byte {
	t.Helper()
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return pemOf(t, "PUBLIC KEY", der)
}

// Every kind of key a PEM file may hold verifies the algorithms of its
// kind, and only those.
func TestPublicKeysOfEveryKind(t *testing.T) {
	t.Parallel()
	rsaKey, _ := rsa.GenerateKey(rand.Reader, 2048)
	p384, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	edPub, edKey, _ := ed25519.GenerateKey(rand.Reader)
	p256, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	certDER, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "idp"},
		NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour),
	}, &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "idp"}}, &p256.PublicKey, p256)
	if err != nil {
		t.Fatal(err)
	}
	keys := slices.Concat(
		pemOf(t, "RSA PUBLIC KEY", x509.MarshalPKCS1PublicKey(&rsaKey.PublicKey)),
		pkixPEM(t, &p384.PublicKey),
		pkixPEM(t, edPub),
		pemOf(t, "CERTIFICATE", certDER),
	)
	v, err := auth.NewVerifier(auth.Options{PublicKeysPEM: keys, Audience: "orders-api"})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := v.Algorithms(), []string{"ES256", "ES384", "EdDSA", "PS256", "PS384", "PS512", "RS256", "RS384", "RS512"}; !slices.Equal(got, want) {
		t.Errorf("algorithms %v, want %v", got, want)
	}
	claims := auth.Claims{RegisteredClaims: jwt.RegisteredClaims{Subject: "ops", Audience: jwt.ClaimStrings{"orders-api"},
		ExpiresAt: jwt.NewNumericDate(time.Now().Add(time.Minute))}, Role: auth.RoleOperator}
	for _, tc := range []struct {
		method jwt.SigningMethod
		key    any
		ok     bool
	}{
		{jwt.SigningMethodRS512, rsaKey, true},
		{jwt.SigningMethodES384, p384, true},
		{jwt.SigningMethodEdDSA, edKey, true},
		{jwt.SigningMethodES256, p256, true},
		{jwt.SigningMethodES256, mustEC(t, elliptic.P256()), false}, // a key not in the file
		{jwt.SigningMethodHS256, secret, false},                     // no secret configured
	} {
		token, err := jwt.NewWithClaims(tc.method, claims).SignedString(tc.key)
		if err != nil {
			t.Fatal(err)
		}
		p, err := v.Verify(token)
		if ok := err == nil; ok != tc.ok {
			t.Errorf("%s: %v, want ok %v", tc.method.Alg(), err, tc.ok)
		}
		if tc.ok && (p.Subject != "ops" || !p.Operator()) {
			t.Errorf("%s: %+v", tc.method.Alg(), p)
		}
		var refusal *auth.Refusal
		if !tc.ok && (!errors.As(err, &refusal) || refusal.Reason != "bad_signature") {
			t.Errorf("%s: %v, want a bad_signature refusal", tc.method.Alg(), err)
		}
	}
}

func mustEC(t *testing.T, c elliptic.Curve) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(c, rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// An identity provider signs the tokens of all its clients with the same
// keys: a Verifier of its public keys needs the audience of this API, and
// refuses a token the provider issued for another client.
func TestPublicKeysNeedAnAudience(t *testing.T) {
	t.Parallel()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	keys := pkixPEM(t, &key.PublicKey)
	if _, err := auth.NewVerifier(auth.Options{PublicKeysPEM: keys}); err == nil || !strings.Contains(err.Error(), "need an audience") {
		t.Fatalf("public keys without an audience: %v, want an error", err)
	}
	v, err := auth.NewVerifier(auth.Options{PublicKeysPEM: keys, Audience: "orders-api"})
	if err != nil {
		t.Fatal(err)
	}
	for aud, want := range map[string]string{"orders-api": "", "another-app": "wrong_audience", "": "invalid_claims"} {
		c := auth.Claims{RegisteredClaims: jwt.RegisteredClaims{Subject: "c-1", ExpiresAt: jwt.NewNumericDate(time.Now().Add(time.Minute))}}
		if aud != "" {
			c.Audience = jwt.ClaimStrings{aud}
		}
		token, err := jwt.NewWithClaims(jwt.SigningMethodES256, c).SignedString(key)
		if err != nil {
			t.Fatal(err)
		}
		var refusal *auth.Refusal
		switch _, err := v.Verify(token); {
		case want == "" && err != nil:
			t.Errorf("a token for %q: %v", aud, err)
		case want != "" && (!errors.As(err, &refusal) || refusal.Reason != want):
			t.Errorf("a token for %q: %v, want a %s refusal", aud, err, want)
		}
	}
	// A secret is this API's own: no other client has it, so no audience is needed.
	if _, err := auth.NewVerifier(auth.Options{Secret: secret}); err != nil {
		t.Errorf("a secret without an audience: %v", err)
	}
}

// A file that holds no public key, or anything else, fails with a message
// that names the block.
func TestBadPublicKeys(t *testing.T) {
	t.Parallel()
	rsaKey, _ := rsa.GenerateKey(rand.Reader, 2048)
	for name, tc := range map[string]struct {
		raw  []byte
		want string
	}{
		"empty":       {nil, "no PEM block"},
		"not PEM":     {[]byte("hello"), "no PEM block"},
		"private key": {slices.Concat(pkixPEM(t, &rsaKey.PublicKey), pemOf(t, "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(rsaKey))), "PEM block 2 (RSA PRIVATE KEY)"},
		"garbage":     {pemOf(t, "PUBLIC KEY", []byte("nope")), "PEM block 1 (PUBLIC KEY)"},
	} {
		_, err := auth.ParsePublicKeys(tc.raw)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", name, err, tc.want)
		}
	}
	if _, err := auth.NewVerifier(auth.Options{Secret: []byte("short")}); err == nil {
		t.Error("a 5-byte secret was accepted")
	}
	if _, err := auth.NewVerifier(auth.Options{}); err == nil {
		t.Error("a verifier without keys was made")
	}
}

// Mint's tokens verify, with their issuer, audience and role; the leeway
// lets a token that expired a moment ago through, and no more.
func TestMintAndLeeway(t *testing.T) {
	t.Parallel()
	token, err := auth.Mint(secret, auth.Principal{Subject: "c-1", Role: auth.RoleCustomer}, time.Minute, "iss", "aud")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	clock := func(d time.Duration) func() time.Time { return func() time.Time { return now.Add(d) } }
	for _, tc := range []struct {
		after time.Duration
		ok    bool
	}{{0, true}, {time.Minute + auth.Leeway/2, true}, {time.Minute + 2*auth.Leeway, false}} {
		v, err := auth.NewVerifier(auth.Options{Secret: secret, Issuer: "iss", Audience: "aud", Now: clock(tc.after)})
		if err != nil {
			t.Fatal(err)
		}
		p, err := v.Verify(token)
		if (err == nil) != tc.ok || (tc.ok && p != auth.Principal{Subject: "c-1", Role: auth.RoleCustomer}) {
			t.Errorf("after %v: %+v, %v; want ok %v", tc.after, p, err, tc.ok)
		}
	}
	if _, err := auth.Mint([]byte("short"), auth.Principal{Subject: "x"}, time.Minute, "", ""); err == nil {
		t.Error("Mint signed with a 5-byte secret")
	}
	if p, _ := auth.Off().Verify(""); !p.Operator() {
		t.Errorf("Off: %+v, want an operator", p)
	}
}

// A shipped client's token: API_TOKEN; else one it mints with the API's
// secret, from API_JWT_SECRET or the file of API_JWT_SECRET_FILE (the
// compose demo's secrets volume); else none.
func TestClientToken(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "api-jwt-secret")
	if err := os.WriteFile(file, append(slices.Clone(secret), '\n'), 0o600); err != nil {
		t.Fatal(err)
	}
	v, err := auth.NewVerifier(auth.Options{Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	for name, environ := range map[string]map[string]string{
		"the secret":      {"API_JWT_SECRET": string(secret)},
		"the secret file": {"API_JWT_SECRET_FILE": file},
	} {
		token, err := auth.ClientToken(func(k string) string { return environ[k] })
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if p, err := v.Verify(token); err != nil || !p.Operator() {
			t.Errorf("%s: the token verifies as %+v, %v; want an operator's", name, p, err)
		}
	}
	if token, err := auth.ClientToken(func(k string) string { return map[string]string{"API_TOKEN": "given"}[k] }); token != "given" || err != nil {
		t.Errorf("API_TOKEN: %q, %v", token, err)
	}
	if token, err := auth.ClientToken(func(string) string { return "" }); token != "" || err != nil {
		t.Errorf("nothing set: %q, %v", token, err)
	}
	if _, err := auth.ClientToken(func(k string) string {
		return map[string]string{"API_JWT_SECRET_FILE": filepath.Join(t.TempDir(), "none")}[k]
	}); err == nil || !strings.Contains(err.Error(), "API_JWT_SECRET_FILE") {
		t.Errorf("a missing file: %v", err)
	}
}
