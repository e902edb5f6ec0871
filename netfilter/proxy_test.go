package netfilter

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/vibedom/vibedom/netfilter/internal/mitmtest"
)

// proxyClient is an HTTP client that uses the explicit proxy and trusts
// only the vibedom CA.
func (v *testEnv) proxyClient(proxy *url.URL, h2 bool) *http.Client {
	tr := &http.Transport{
		Proxy:             http.ProxyURL(proxy),
		TLSClientConfig:   &tls.Config{RootCAs: v.CA.Pool()},
		ForceAttemptHTTP2: h2,
	}
	v.T().Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

func TestExplicitProxy(t *testing.T) {
	t.Parallel()
	v := newTestEnv(t, mitmtest.Rules)
	var hits atomic.Int32
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1); mitmtest.EchoInfo(w, r) })
	v.UpstreamTLS("api.test", 443, v.UpCA, h)
	v.UpstreamTLS("evil.test", 443, v.UpCA, h)
	v.UpstreamPlain("plain.test", 80, h)
	v.UpstreamPlain("evil.test", 80, h)
	proxy := v.ProxyListener()

	allowed := []struct {
		name, url, want string
		h2              bool
	}{
		{"CONNECT then http/1.1", "https://api.test/a?k=v", "hello from api.test /a?k=v", false},
		{"CONNECT then h2", "https://api.test/b", "hello from api.test /b", true},
		{"absolute URI", "http://plain.test/c", "hello from plain.test /c", false},
	}
	for _, tt := range allowed {
		t.Run(tt.name, func(t *testing.T) {
			resp, err := v.proxyClient(proxy, tt.h2).Get(tt.url)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || string(body) != tt.want {
				t.Errorf("got %d %q, want 200 %q", resp.StatusCode, body, tt.want)
			}
		})
	}
	before := hits.Load()

	denied := []struct {
		name, url, wantBody, refused, hint string
		json                               bool
	}{
		{"CONNECT to a denied name", "https://evil.test/", "evil.test:443 is not allowed", "evil.test:443", "vibedom allow SESSION evil.test\n", false},
		{"absolute URI to a denied name", "http://evil.test/x?secret=1", "evil.test:80 is not allowed", "evil.test:80", "vibedom allow SESSION evil.test\n", false},
		{"absolute URI to a denied name, JSON", "http://evil.test/j", `"reason":"evil.test:80 is not allowed`, "evil.test:80", `"allow":"vibedom allow SESSION evil.test"`, true},
		{"CONNECT to a denied name, JSON", "https://evil.test/", `"error":"vibedom_refused","host":"evil.test","port":443`, "evil.test:443", `"allow":"vibedom allow SESSION evil.test"`, true},
		{"CONNECT to an allowed name on a denied port", "https://api.test:9999/", "allows other ports only", "api.test:9999", "vibedom allow SESSION api.test:9999\n", false},
		{"absolute URI to an IP no rule names", "http://127.0.0.1:1/", "no rule names this IP", "127.0.0.1:1", "", false},
	}
	for _, tt := range denied {
		t.Run(tt.name, func(t *testing.T) {
			// Speak to the proxy by hand: Go's client turns a CONNECT
			// refusal into an error without the body.
			conn, err := net.Dial("tcp", proxy.Host)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			u, _ := url.Parse(tt.url)
			accept := "*/*"
			if tt.json {
				accept = "application/json"
			}
			if u.Scheme == "https" {
				fmt.Fprintf(conn, "CONNECT %s:%s HTTP/1.1\r\nHost: %[1]s:%[2]s\r\nAccept: %s\r\n\r\n", u.Hostname(), portOr(u, "443"), accept)
			} else {
				fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: %s\r\nAccept: %s\r\n\r\n", tt.url, u.Host, accept)
			}
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusForbidden {
				t.Errorf("status: got %d, want 403", resp.StatusCode)
			}
			if !strings.Contains(string(body), tt.wantBody) {
				t.Errorf("body %q: want it to say %q", body, tt.wantBody)
			}
			// Every refusal says what was refused, and a policy
			// refusal how the user can allow it; never for an address
			// no rule can open.
			if got := resp.Header.Get("X-Vibedom-Refused"); got != tt.refused {
				t.Errorf("X-Vibedom-Refused: %q, want %q", got, tt.refused)
			}
			if tt.hint != "" && !strings.Contains(string(body), tt.hint) {
				t.Errorf("body %q: no hint %q", body, tt.hint)
			}
			if tt.hint == "" && strings.Contains(string(body), "vibedom allow") {
				t.Errorf("body %q offers a rule for an address no rule opens", body)
			}
			if ct := resp.Header.Get("Content-Type"); tt.json != strings.HasPrefix(ct, "application/json") {
				t.Errorf("Content-Type %q (JSON asked: %v)", ct, tt.json)
			}
		})
	}
	t.Run("CONNECT allowed but inner SNI names another host", func(t *testing.T) {
		conn := proxyConnect(t, proxy, "api.test:443")
		tc := tls.Client(conn, &tls.Config{ServerName: "evil.test", RootCAs: v.CA.Pool()})
		if err := tc.HandshakeContext(t.Context()); err == nil || !strings.Contains(err.Error(), "access denied") {
			t.Errorf("handshake: got %v, want access denied", err)
		}
	})
	t.Run("CONNECT allowed but inner Host names another host", func(t *testing.T) {
		conn := proxyConnect(t, proxy, "api.test:443")
		tc := tls.Client(conn, &tls.Config{ServerName: "api.test", RootCAs: v.CA.Pool()})
		fmt.Fprintf(tc, "GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusMisdirectedRequest {
			t.Errorf("status: got %d, want 421", resp.StatusCode)
		}
	})
	t.Run("CONNECT with the ClientHello pipelined", func(t *testing.T) {
		conn, err := net.Dial("tcp", proxy.Host)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		// Write the CONNECT and the TLS handshake back to back, then read
		// the 200 from what the TLS layer sees first.
		pr := &connectReader{Conn: conn}
		fmt.Fprintf(conn, "CONNECT api.test:443 HTTP/1.1\r\nHost: api.test:443\r\n\r\n")
		tc := tls.Client(pr, &tls.Config{ServerName: "api.test", RootCAs: v.CA.Pool()})
		fmt.Fprintf(tc, "GET /pipelined HTTP/1.1\r\nHost: api.test\r\nConnection: close\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		if string(body) != "hello from api.test /pipelined" {
			t.Errorf("body: got %q", body)
		}
	})
	t.Run("origin-form request to the proxy", func(t *testing.T) {
		conn, err := net.Dial("tcp", proxy.Host)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		fmt.Fprintf(conn, "GET /x HTTP/1.1\r\nHost: api.test\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("status: got %d, want 400", resp.StatusCode)
		}
	})
	t.Run("CONNECT target malformed", func(t *testing.T) {
		for _, target := range []string{"api.test", "api.test:0", "api..test:443", "[::1:443"} {
			conn, err := net.Dial("tcp", proxy.Host)
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(conn, "CONNECT %s HTTP/1.1\r\nHost: %[1]s\r\n\r\n", target)
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			conn.Close()
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != http.StatusBadRequest {
				t.Errorf("CONNECT %s: status %d, want 400", target, resp.StatusCode)
			}
		}
	})
	if got := hits.Load(); got != before+1 {
		t.Errorf("upstream requests after the refusals: got %d, want %d (only the pipelined one)", got, before+1)
	}

	v.Events.WaitCount(t, "proxy refusal", 5, mitmtest.IsKind("proxy", "deny"))
	v.Events.WaitCount(t, "connect refusal", 1, mitmtest.IsKind("connect", "deny"))
	v.Events.WaitCount(t, "request refusal", 4, mitmtest.IsKind("request", "deny"))
	alerts := v.alerts()
	var proxyDenies, connectDenies, requestDenies int
	for _, a := range alerts {
		switch {
		case a["kind"] == "proxy" && a["decision"] == "deny":
			proxyDenies++
		case a["kind"] == "connect" && a["decision"] == "deny":
			connectDenies++
		case a["kind"] == "request" && a["decision"] == "deny":
			requestDenies++
		}
		if strings.Contains(fmt.Sprint(a["url"]), "secret=1") {
			t.Errorf("alert holds a query value: %v", a)
		}
	}
	// CONNECT evil (twice), CONNECT api:9999, 3 of 4 malformed CONNECTs.
	// The last malformed target is refused by the HTTP parser itself,
	// before the proxy sees a request, so it is not in the log.
	if proxyDenies != 6 {
		t.Errorf("proxy refusals in alerts.jsonl: got %d, want 6", proxyDenies)
	}
	if connectDenies != 1 { // the SNI mismatch inside the tunnel
		t.Errorf("connect refusals in alerts.jsonl: got %d, want 1", connectDenies)
	}
	// absolute URI evil (twice), absolute URI IP, inner Host mismatch, origin-form.
	if requestDenies != 5 {
		t.Errorf("request refusals in alerts.jsonl: got %d, want 5: %v", requestDenies, alerts)
	}
}

func portOr(u *url.URL, def string) string {
	if p := u.Port(); p != "" {
		return p
	}
	return def
}

// proxyConnect opens a CONNECT tunnel through the explicit proxy.
func proxyConnect(t *testing.T, proxy *url.URL, target string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", proxy.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	fmt.Fprintf(conn, "CONNECT %s HTTP/1.1\r\nHost: %[1]s\r\n\r\n", target)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, &http.Request{Method: "CONNECT"})
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		t.Fatalf("CONNECT %s: status %d", target, resp.StatusCode)
	}
	if br.Buffered() != 0 {
		t.Fatalf("proxy sent bytes after its 200")
	}
	return conn
}

// connectReader swallows the proxy's "200 Connection established" response
// before handing the stream to TLS.
type connectReader struct {
	net.Conn
	br   *bufio.Reader
	done bool
}

func (c *connectReader) Read(p []byte) (int, error) {
	if !c.done {
		c.br = bufio.NewReader(c.Conn)
		resp, err := http.ReadResponse(c.br, &http.Request{Method: "CONNECT"})
		if err != nil {
			return 0, err
		}
		if resp.StatusCode != 200 {
			return 0, fmt.Errorf("CONNECT: status %d", resp.StatusCode)
		}
		c.done = true
	}
	return c.br.Read(p)
}
