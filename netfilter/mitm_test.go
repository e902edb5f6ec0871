package netfilter

import (
	"github.com/vibedom/vibedom/netfilter/egress"
	"github.com/vibedom/vibedom/netfilter/internal/mitmtest"
	"github.com/vibedom/vibedom/netfilter/mitm"

	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
)

func TestInterceptHTTP1AndHTTP2(t *testing.T) {
	t.Parallel()
	v := newTestEnv(t, mitmtest.Rules)
	v.UpstreamTLS("api.test", 443, v.UpCA, http.HandlerFunc(mitmtest.EchoInfo))
	v.UpstreamTLS("a.b.wild.test", 443, v.UpCA, http.HandlerFunc(mitmtest.EchoInfo))
	v.UpstreamTLS("api.test", 8443, v.UpCA, http.HandlerFunc(mitmtest.EchoInfo))
	tests := []struct {
		name      string
		h2        bool
		url       string
		wantProto int
		wantHost  string
	}{
		{"http/1.1", false, "https://api.test/hello?token=s3cr3t&x=1", 1, "api.test"},
		{"h2", true, "https://api.test/hello?token=s3cr3t&x=1", 2, "api.test"},
		{"wildcard name", true, "https://a.b.wild.test/x", 2, "a.b.wild.test"},
		{"non-default port", false, "https://api.test:8443/p", 1, "api.test:8443"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &http.Client{Transport: v.GuestTransport(tt.h2)}
			for i := range 3 { // keep-alive: several requests on one connection
				req, _ := http.NewRequestWithContext(t.Context(), "GET", tt.url, nil)
				resp, err := c.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					t.Fatalf("status: got %d, want 200 (%s)", resp.StatusCode, body)
				}
				if resp.ProtoMajor != tt.wantProto {
					t.Errorf("guest-side protocol: got %s, want major %d", resp.Proto, tt.wantProto)
				}
				// Upstream speaks the guest's protocol (every test server
				// offers h2).
				if got, want := resp.Header.Get("X-Upstream-Proto"), resp.Proto; got != want {
					t.Errorf("upstream protocol: got %s, want %s (the guest's)", got, want)
				}
				if got := resp.Header.Get("X-Upstream-Host"); got != tt.wantHost {
					t.Errorf("upstream Host: got %q, want %q", got, tt.wantHost)
				}
				if !strings.HasPrefix(string(body), "hello from "+tt.wantHost) {
					t.Errorf("body: got %q", body)
				}
				if i == 0 {
					// The chain the guest sees verifies against the vibedom CA
					// (the client trusts nothing else) and names the host.
					certs := resp.TLS.PeerCertificates
					if len(certs) == 0 || certs[0].CheckSignatureFrom(v.CA.Certificate()) != nil {
						t.Errorf("leaf not signed by the vibedom CA")
					}
					if len(resp.TLS.VerifiedChains) == 0 || !resp.TLS.VerifiedChains[0][len(resp.TLS.VerifiedChains[0])-1].Equal(v.CA.Certificate()) {
						t.Errorf("verified chain does not end at the vibedom CA")
					}
				}
			}
		})
	}
	ev := v.Events.Wait(t, "request with query", func(e egress.Event) bool { return e.Kind == "request" && strings.Contains(e.URL, "token") })
	if want := "https://api.test/hello?token=REDACTED&x=REDACTED"; ev.URL != want {
		t.Errorf("logged URL: got %q, want %q", ev.URL, want)
	}
	if ev.Status != 200 || ev.BytesDn == 0 || ev.Decision != "allow" || ev.Rule != "api.test" || ev.Src == "" {
		t.Errorf("request event: %+v", ev)
	}
	v.log.Close()
	data, _ := os.ReadFile(filepath.Join(v.logDir, NetworkLogFile))
	if bytes.Contains(data, []byte("s3cr3t")) {
		t.Errorf("network.jsonl holds the query value")
	}
	// One connect event per connection: 3 keep-alive requests do not open 3.
	conns := 0
	for _, e := range v.Events.All() {
		if e.Kind == "connect" && e.Name == "api.test" && e.Port == 443 {
			conns++
		}
	}
	if conns > 2 {
		t.Errorf("connections to api.test:443: got %d, want at most 2 (h1 and h2 clients, keep-alive)", conns)
	}
}

func TestSNIRefused(t *testing.T) {
	t.Parallel()
	v := newTestEnv(t, mitmtest.Rules)
	v.UpstreamTLS("api.test", 443, v.UpCA, http.HandlerFunc(mitmtest.EchoInfo))
	tests := []struct {
		name, admitted, sni string
		skipVerify          bool
		reason              string
	}{
		{"other allowed name", "api.test", "x.wild.test", false, "does not match the admitted name api.test"},
		{"denied name", "api.test", "evil.test", false, "does not match"},
		{"no sni", "api.test", "", true, "without SNI"},
		{"case and dot are not a mismatch but a different name is", "api.test", "API.TEST.evil", false, "does not match"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			conn := v.GuestConn(tt.admitted, 443)
			defer conn.Close()
			tc := tls.Client(conn, &tls.Config{ServerName: tt.sni, RootCAs: v.CA.Pool(), InsecureSkipVerify: tt.skipVerify})
			err := tc.HandshakeContext(t.Context())
			if err == nil {
				t.Fatal("handshake succeeded; want it refused")
			}
			if !strings.Contains(err.Error(), "access denied") {
				t.Errorf("handshake error %q: want a TLS access_denied alert", err)
			}
			v.Events.Wait(t, "refused connect", func(e egress.Event) bool {
				return e.Kind == "connect" && e.Decision == "deny" && strings.Contains(e.Reason, tt.reason)
			})
		})
	}
	t.Run("same name in other case with trailing dot is accepted", func(t *testing.T) {
		conn := v.GuestConn("api.test", 443)
		defer conn.Close()
		tc := tls.Client(conn, &tls.Config{ServerName: "API.Test.", RootCAs: v.CA.Pool(), InsecureSkipVerify: true})
		if err := tc.HandshakeContext(t.Context()); err != nil {
			t.Fatalf("handshake: %v", err)
		}
	})
	v.Events.WaitCount(t, "SNI refusal", len(tests), func(e egress.Event) bool {
		return e.Kind == "connect" && e.Decision == "deny" && strings.Contains(e.Reason, "SNI")
	})
	alerts := v.alerts()
	n := 0
	for _, a := range alerts {
		if a["kind"] == "connect" && a["decision"] == "deny" && strings.Contains(a["reason"].(string), "SNI") {
			n++
		}
	}
	if n < len(tests) {
		t.Errorf("alerts.jsonl has %d SNI refusals, want %d: %v", n, len(tests), alerts)
	}
}

func TestGuestDistrustIsAnErrorNotAnAlert(t *testing.T) {
	t.Parallel()
	v := newTestEnv(t, mitmtest.Rules)
	conn := v.GuestConn("api.test", 443)
	defer conn.Close()
	tc := tls.Client(conn, &tls.Config{ServerName: "api.test", RootCAs: v.UpCA.Pool()}) // not the vibedom CA
	if err := tc.HandshakeContext(t.Context()); err == nil {
		t.Fatal("handshake succeeded with a guest that does not trust the vibedom CA")
	}
	ev := v.Events.Wait(t, "connect", func(e egress.Event) bool { return e.Kind == "connect" })
	if ev.Decision != "error" || !strings.Contains(ev.Reason, "handshake") {
		t.Errorf("connect event: %+v, want decision error about the handshake", ev)
	}
	if a := v.alerts(); len(a) != 0 {
		t.Errorf("alerts: %v, want none", a)
	}
}

func TestHostRefused(t *testing.T) {
	t.Parallel()
	v := newTestEnv(t, mitmtest.Rules)
	var hits atomic.Int32
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1); mitmtest.EchoInfo(w, r) })
	v.UpstreamTLS("api.test", 443, v.UpCA, h)
	v.UpstreamTLS("x.wild.test", 443, v.UpCA, h)
	v.UpstreamPlain("plain.test", 80, h)
	tests := []struct {
		name, url, host string
		h2              bool
	}{
		{"https h1 other allowed host", "https://api.test/", "x.wild.test", false},
		{"https h2 authority", "https://api.test/", "x.wild.test", true},
		{"https port differs", "https://api.test/", "api.test:8443", false},
		{"https explicit default port is fine? no: other port", "https://api.test/", "api.test:80", false},
		{"plain http", "http://plain.test/", "evil.test", false},
		{"plain http with port", "http://plain.test/", "plain.test:8080", false},
		{"invalid host", "https://api.test/", "api..test", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &http.Client{Transport: v.GuestTransport(tt.h2)}
			req, _ := http.NewRequestWithContext(t.Context(), "GET", tt.url, nil)
			req.Host = tt.host
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusMisdirectedRequest {
				t.Errorf("status: got %d, want 421 (%s)", resp.StatusCode, body)
			}
			if !strings.HasPrefix(string(body), "vibedom: ") {
				t.Errorf("body %q: want a vibedom explanation", body)
			}
		})
	}
	t.Run("explicit default port accepted", func(t *testing.T) {
		c := &http.Client{Transport: v.GuestTransport(false)}
		req, _ := http.NewRequestWithContext(t.Context(), "GET", "https://api.test/", nil)
		req.Host = "api.test:443"
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("status: got %d, want 200", resp.StatusCode)
		}
	})
	t.Run("absolute-form request line on an intercepted connection", func(t *testing.T) {
		conn := v.GuestConn("plain.test", 80)
		defer conn.Close()
		fmt.Fprintf(conn, "GET http://evil.test/ HTTP/1.1\r\nHost: plain.test\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusMisdirectedRequest {
			t.Errorf("status: got %d, want 421", resp.StatusCode)
		}
	})
	t.Run("second request on a kept-alive connection", func(t *testing.T) {
		conn := v.GuestConn("plain.test", 80)
		defer conn.Close()
		fmt.Fprintf(conn, "GET /one HTTP/1.1\r\nHost: plain.test\r\n\r\nGET /two HTTP/1.1\r\nHost: evil.test\r\n\r\n")
		br := bufio.NewReader(conn)
		for i, want := range []int{200, http.StatusMisdirectedRequest} {
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			if resp.StatusCode != want {
				t.Errorf("request %d: status %d, want %d", i+1, resp.StatusCode, want)
			}
		}
	})
	t.Run("CONNECT on an intercepted connection", func(t *testing.T) {
		conn := v.GuestConn("plain.test", 80)
		defer conn.Close()
		fmt.Fprintf(conn, "CONNECT evil.test:443 HTTP/1.1\r\nHost: evil.test:443\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusMethodNotAllowed {
			t.Errorf("status: got %d, want 405", resp.StatusCode)
		}
	})
	if hits.Load() != 2 {
		t.Errorf("upstream saw %d requests, want only the 2 accepted ones", hits.Load())
	}
	v.Events.WaitCount(t, "request refusal", len(tests)+3, mitmtest.IsKind("request", "deny"))
	n := 0
	for _, a := range v.alerts() {
		if a["kind"] == "request" && a["decision"] == "deny" {
			n++
		}
	}
	if n != len(tests)+3 {
		t.Errorf("alerts.jsonl request refusals: got %d, want %d", n, len(tests)+3)
	}
}

// recordingFilter replaces "SECRET" in bodies while streaming and reports a
// finding.
type recordingFilter struct{ fail bool }

func (f recordingFilter) FilterRequest(_ context.Context, d mitm.Destination, r *http.Request) (func() []egress.Finding, error) {
	if f.fail {
		return nil, errors.New("policy says no")
	}
	var found atomic.Int32
	if r.Body != nil && r.Body != http.NoBody {
		pr, pw := io.Pipe()
		src := r.Body
		go func() {
			b, err := io.ReadAll(io.LimitReader(src, 1<<20)) // test bodies are small
			if bytes.Contains(b, []byte("SECRET")) {
				found.Add(1)
				b = bytes.ReplaceAll(b, []byte("SECRET"), []byte("[redacted]"))
			}
			pw.Write(b)
			pw.CloseWithError(err)
		}()
		r.Body = pr
		r.ContentLength = -1
		r.Header.Del("Content-Length")
	}
	return func() []egress.Finding {
		if found.Load() == 0 {
			return nil
		}
		return []egress.Finding{{Category: "test-secret", Prefix: "SECR", Length: 6, Where: "body"}}
	}, nil
}

func TestRequestFilter(t *testing.T) {
	t.Parallel()
	for _, fail := range []bool{false, true} {
		t.Run(fmt.Sprintf("fail=%v", fail), func(t *testing.T) {
			v := newTestEnv(t, mitmtest.Rules, func(c *mitm.EngineConfig) { c.Filter = recordingFilter{fail: fail} })
			var got atomic.Value
			v.UpstreamTLS("api.test", 443, v.UpCA, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				b, _ := io.ReadAll(r.Body)
				got.Store(string(b))
			}))
			c := &http.Client{Transport: v.GuestTransport(true)}
			resp, err := c.Post("https://api.test/v1", "text/plain", strings.NewReader("key=SECRET;"))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if fail {
				if resp.StatusCode != http.StatusForbidden || got.Load() != nil {
					t.Errorf("failing filter: status %d, upstream saw %v; want 403 and nothing", resp.StatusCode, got.Load())
				}
				return
			}
			if g, _ := got.Load().(string); g != "key=[redacted];" {
				t.Errorf("upstream body: got %q", g)
			}
			ev := v.Events.Wait(t, "scrub", mitmtest.IsKind("request", "scrub"))
			if len(ev.Findings) != 1 || ev.Findings[0].Category != "test-secret" {
				t.Errorf("findings: %+v", ev.Findings)
			}
			if a := v.alerts(); len(a) != 1 || a[0]["decision"] != "scrub" {
				t.Errorf("alerts: %v", a)
			}
		})
	}
}
