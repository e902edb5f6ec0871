package session

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/vibedom/vibedom/credentials"
	"github.com/vibedom/vibedom/home"
	nfegress "github.com/vibedom/vibedom/netfilter/egress"
)

// TestStartLoginsRefusesDeadLogin (issue 21): a session whose
// subscription login cannot be refreshed (the refresh token expired, or
// the vendor refuses it) stops before the VM boots with one line saying
// what to run; the host's refresh goes to the token endpoint through the
// session's --resolve and --ca-file.
func TestStartLoginsRefusesDeadLogin(t *testing.T) {
	var calls int
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls++
		if r.Host != "platform.claude.com" || r.URL.Path != "/v1/oauth/token" {
			t.Errorf("the refresh went to %s%s", r.Host, r.URL.Path)
		}
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, `{"error":"invalid_grant"}`)
	}))
	ca := tokenHostTLS(t, srv, "platform.claude.com")
	srv.StartTLS()
	defer srv.Close()
	res, err := nfegress.ParseResolve("platform.claude.com:443:" + srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	claude, _ := credentials.LookupLogin("claude")
	for _, c := range []struct {
		name           string
		refreshExpires time.Time
		wantCalls      int
	}{
		{"refused by the vendor", time.Time{}, 1},
		{"refresh token expired", time.Now().Add(-time.Hour), 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			calls = 0
			hd := t.TempDir()
			oauth := map[string]any{"accessToken": "sk-ant-oat01-" + strings.Repeat("a", 90), "refreshToken": "sk-ant-ort01-" + strings.Repeat("b", 90),
				"expiresAt": time.Now().Add(-time.Minute).UnixMilli(), "scopes": []string{"user:inference"}}
			if !c.refreshExpires.IsZero() {
				oauth["refreshTokenExpiresAt"] = c.refreshExpires.UnixMilli()
			}
			doc, _ := json.Marshal(map[string]any{"claudeAiOauth": oauth})
			l, err := credentials.ParseLogin(claude, doc, "test")
			if err != nil {
				t.Fatal(err)
			}
			if err := credentials.SaveLogin(hd, l); err != nil {
				t.Fatal(err)
			}
			s := &sess{opts: Options{Home: home.Home(hd), Agent: &AgentOptions{Name: "claude"}, Progress: io.Discard},
				log: slog.New(slog.DiscardHandler)}
			ls, err := s.loadLogin()
			if err != nil || ls == nil {
				t.Fatalf("loadLogin: %v %v", ls, err)
			}
			s.creds, _ = credentials.NewSession(nil)
			s.creds.AddLogin(ls)
			err = s.startLogins(t.Context(), []nfegress.Resolve{res}, []*x509.Certificate{ca})
			if !errors.Is(err, credentials.ErrRefreshRefused) || !strings.Contains(err.Error(), "vibedom auth login claude") ||
				strings.Contains(err.Error(), "\n") || strings.Contains(err.Error(), strings.Repeat("b", 20)) {
				t.Errorf("startLogins: %v", err)
			}
			if calls != c.wantCalls {
				t.Errorf("token endpoint called %d times, want %d", calls, c.wantCalls)
			}
		})
	}
}

// tokenHostTLS gives srv a certificate for name from a new CA, returned.
func tokenHostTLS(t *testing.T, srv *httptest.Server, name string) *x509.Certificate {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "token CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), DNSNames: []string{name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, KeyUsage: x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}
	return ca
}

// TestCheckAgentKeyLogin (issue 21): an agent runs on a subscription login
// of its own kind; `--agent codex` with only a Claude login, or with a
// damaged login record, is refused with one line saying what to run.
func TestCheckAgentKeyLogin(t *testing.T) {
	t.Setenv("ANTHROPIC_API_KEY", "")
	t.Setenv("OPENAI_API_KEY", "")
	hd := t.TempDir()
	claude, _ := credentials.LookupLogin("claude")
	doc, _ := json.Marshal(map[string]any{"claudeAiOauth": map[string]any{"accessToken": "sk-ant-oat01-" + strings.Repeat("a", 90),
		"refreshToken": "sk-ant-ort01-" + strings.Repeat("b", 90), "expiresAt": time.Now().Add(time.Hour).UnixMilli()}})
	l, err := credentials.ParseLogin(claude, doc, "test")
	if err != nil {
		t.Fatal(err)
	}
	if err := credentials.SaveLogin(hd, l); err != nil {
		t.Fatal(err)
	}
	if err := checkAgentKey("claude", home.Home(hd)); err != nil {
		t.Errorf("claude with a claude login: %v", err)
	}
	err = checkAgentKey("codex", home.Home(hd))
	if err == nil || !strings.Contains(err.Error(), "vibedom auth import codex") || !strings.Contains(err.Error(), "OPENAI_API_KEY") || strings.Contains(err.Error(), "\n") {
		t.Errorf("codex with only a claude login: %v", err)
	}
	os.WriteFile(credentials.WhereLogin(hd, claude), []byte("{"), 0o600)
	if err := checkAgentKey("claude", home.Home(hd)); err == nil || !strings.Contains(err.Error(), "vibedom auth import claude") {
		t.Errorf("claude with a damaged login: %v", err)
	}
}
