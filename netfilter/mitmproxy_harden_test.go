package netfilter

import (
	"bufio"
	"crypto/sha1"
	"crypto/tls"
	"encoding/base64"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/cookiejar"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vibedom/vibedom/netfilter/egress"
	"github.com/vibedom/vibedom/netfilter/internal/mitmtest"
	"github.com/vibedom/vibedom/netfilter/mitmproxy"

	"github.com/vibedom/vibedom/credentials"
	"github.com/vibedom/vibedom/netfilter/mitm"
)

// rawUpstream is a TCP (or TLS) listener reachable as name:port that keeps
// every byte it is sent.
type rawUpstream struct {
	mu    sync.Mutex
	got   []byte
	conns atomic.Int64
}

func (v *testEnv) rawUpstream(name string, port uint16, useTLS bool) *rawUpstream {
	v.T().Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		v.T().Fatal(err)
	}
	if useTLS {
		ln = tls.NewListener(ln, &tls.Config{GetCertificate: func(hi *tls.ClientHelloInfo) (*tls.Certificate, error) {
			return v.UpCA.IssueLeaf(name, time.Hour)
		}})
	}
	v.T().Cleanup(func() { ln.Close() })
	u := &rawUpstream{}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u.conns.Add(1)
			go func() {
				defer c.Close()
				c.Write([]byte("hello\n")) // a server that answers
				b := make([]byte, 4096)
				for {
					n, err := c.Read(b)
					u.mu.Lock()
					u.got = append(u.got, b[:n]...)
					u.mu.Unlock()
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	v.AddServer(name, port, ln.Addr().String())
	return u
}

func (u *rawUpstream) bytes() string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return string(u.got)
}

// rawSecrets are what a guest sends raw in these tests: an AWS key id and
// a GitHub token, after a byte no HTTP request line starts with.
const rawSecrets = "\x00\x01 AKIAIOSFODNN7EXAMPLE ghp_0123456789abcdefghijABCDEFGHIJ012345\n" // gitleaks:allow

// TestMitmproxyRawBytesRefused: on ports 80 and 443 the mitmproxy engine,
// like the Go engine, refuses bytes that are neither TLS nor HTTP (and
// non-HTTP bytes inside TLS) instead of relaying them raw past the DLP;
// the upstream never gets them. On another port raw TCP still passes.
func TestMitmproxyRawBytesRefused(t *testing.T) {
	t.Parallel()
	v := newMitmEnv(t, "mitmproxy", mitmtest.Rules, nil)
	for _, tc := range []struct {
		name   string
		host   string
		port   uint16
		useTLS bool
	}{
		{"port 443", "api.test", 443, false},
		{"port 80", "plain.test", 80, false},
		{"port 443 inside TLS", "x.wild.test", 443, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := v.rawUpstream(tc.host, tc.port, tc.useTLS)
			var c net.Conn = v.GuestConn(tc.host, tc.port)
			defer c.Close()
			c.SetDeadline(time.Now().Add(30 * time.Second))
			if tc.useTLS {
				tc := tls.Client(c, &tls.Config{ServerName: tc.host, RootCAs: v.CA.Pool()})
				if err := tc.Handshake(); err != nil {
					t.Fatalf("handshake: %v", err)
				}
				c = tc
			}
			c.SetDeadline(time.Now().Add(30 * time.Second))
			c.Write([]byte(rawSecrets))
			got, _ := io.ReadAll(c) // until the engine closes the connection
			if strings.Contains(string(got), "hello") {
				t.Errorf("the guest got the upstream's answer: %q", got)
			}
			if b := up.bytes(); strings.Contains(b, "AKIA") || strings.Contains(b, "ghp_") {
				t.Errorf("the upstream got the raw bytes: %q", b)
			}
		})
	}
	t.Run("another port passes", func(t *testing.T) {
		up := v.rawUpstream("opaque.test", 7000, false)
		c := v.GuestConn("opaque.test", 7000)
		defer c.Close()
		c.SetDeadline(time.Now().Add(30 * time.Second))
		c.Write([]byte("\x00\x01 opaque\n"))
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil || line != "hello\n" {
			t.Fatalf("raw TCP on port 7000: %q %v", line, err)
		}
		for deadline := time.Now().Add(20 * time.Second); !strings.Contains(up.bytes(), "opaque") && time.Now().Before(deadline); {
			time.Sleep(20 * time.Millisecond)
		}
		if !strings.Contains(up.bytes(), "opaque") {
			t.Errorf("raw TCP on port 7000 did not reach the upstream: %q", up.bytes())
		}
	})
}

// swapEnv is a mitmproxy engine with a credential swap for api.test's
// x-api-key (placeholder ph, real key real).
func swapEnv(t *testing.T, mopt func(*mitmproxy.Config)) (v *testEnv, real, ph string) {
	real = "sk-ant-api03-" + strings.Repeat("R3al", 20) + "AA" // gitleaks:allow
	ph = "sk-ant-api03-" + strings.Repeat("PhXx", 20) + "BB"   // gitleaks:allow
	filter := NewSwapFilter(mitm.IdentityFilter{}, []credentials.Swap{{Name: "anthropic", Host: "api.test", Header: "x-api-key", Placeholder: ph, Value: real, Token: ph}})
	v = newMitmEnv(t, "mitmproxy", mitmtest.Rules, mopt, func(c *mitm.EngineConfig) {
		c.Filter = filter
		if os.Getenv("DBG") != "" {
			c.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
		}
	})
	return v, real, ph
}

// TestMitmproxyPlainHTTPTo443: plain HTTP to the provider's port 443 never
// gets the real key, on every path through the mitmproxy engine: as a
// transparent connection, inside an explicit proxy's CONNECT tunnel, and
// as an explicit proxy's absolute URI. The fake provider (plain HTTP on
// loopback, as api.test:443) never sees the key; the guest gets a refusal.
func TestMitmproxyPlainHTTPTo443(t *testing.T) {
	t.Parallel()
	v, real, ph := swapEnv(t, nil)
	var seen atomic.Int64
	var leaked atomic.Bool
	v.UpstreamPlain("api.test", 443, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen.Add(1)
		if strings.Contains(r.Header.Get("X-Api-Key"), real) {
			leaked.Store(true)
		}
		io.WriteString(w, "ok")
	}))
	req := "GET /v1/models HTTP/1.1\r\nHost: api.test:443\r\nx-api-key: " + ph + "\r\nConnection: close\r\n\r\n"
	status := func(t *testing.T, c net.Conn) string {
		c.SetDeadline(time.Now().Add(30 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return "no answer: " + err.Error()
		}
		resp.Body.Close()
		return resp.Status
	}
	t.Run("transparent", func(t *testing.T) {
		c := v.GuestConn("api.test", 443)
		defer c.Close()
		io.WriteString(c, req)
		if s := status(t, c); strings.HasPrefix(s, "200") {
			t.Errorf("plain HTTP to :443 answered %s", s)
		}
	})
	proxy := v.ProxyListener()
	t.Run("CONNECT tunnel", func(t *testing.T) {
		c, err := net.Dial("tcp", proxy.Host)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		io.WriteString(c, "CONNECT api.test:443 HTTP/1.1\r\nHost: api.test:443\r\n\r\n")
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, &http.Request{Method: "CONNECT"})
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("CONNECT: %v %v", resp, err)
		}
		io.WriteString(c, req)
		c.SetDeadline(time.Now().Add(30 * time.Second))
		if resp, err := http.ReadResponse(br, nil); err == nil && resp.StatusCode == 200 {
			t.Errorf("plain HTTP in a CONNECT tunnel to :443 answered %s", resp.Status)
		}
	})
	t.Run("absolute URI", func(t *testing.T) {
		// Served by the Go engine's forwarder (the explicit proxy's front
		// end), whose fix for plain HTTP to 443 is the Go engine's.
		c := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(proxy)}}
		r, _ := http.NewRequestWithContext(t.Context(), "GET", "http://api.test:443/v1/models", nil)
		r.Header.Set("x-api-key", ph)
		resp, err := c.Do(r)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				t.Errorf("an absolute http:// URI to :443 answered %s", resp.Status)
			}
		}
	})
	if leaked.Load() {
		t.Error("the provider got the real key over plain HTTP")
	}
	if n := seen.Load(); n != 0 {
		t.Errorf("the provider got %d plain HTTP requests on port 443", n)
	}
}

// echoKey is a fake provider that echoes the x-api-key it gets in every
// place a response can carry it: a header name, trailers, the body, and on
// /ws a WebSocket text message, a ping and a close reason.
func echoKey(w http.ResponseWriter, r *http.Request) {
	k := r.Header.Get("X-Api-Key")
	if r.URL.Path == "/ws" {
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
			"Sec-WebSocket-Accept: "+wsAccept(r.Header.Get("Sec-WebSocket-Key"))+"\r\n\r\n")
		var out []byte
		out = append(out, wsFrame(true, 1, []byte("text "+k), nil)...)
		out = append(out, wsFrame(true, 9, []byte("p "+k), nil)...)
		out = append(out, wsFrame(true, 8, append([]byte{3, 232}, "bye "+k...), nil)...)
		c.Write(out)
		io.Copy(io.Discard, brw) // until the guest closes
		return
	}
	w.Header().Set("Trailer", "X-Tr")
	w.Header()["X-K-"+k] = []string{"1"} // as is, not canonicalised
	w.Header().Set("X-Echo", k)
	io.WriteString(w, "body "+k)
	w.Header().Set("X-Tr", k)
}

// TestMitmproxyEchoedKeyScrubbed: the real key a provider echoes back in
// a header name, header value, the body, HTTP/1 and HTTP/2 trailers, and
// WebSocket text, ping and close frames never reaches the guest.
func TestMitmproxyEchoedKeyScrubbed(t *testing.T) {
	t.Parallel()
	v, real, ph := swapEnv(t, nil)
	v.UpstreamTLS("api.test", 443, v.UpCA, http.HandlerFunc(echoKey))
	for _, h2 := range []bool{false, true} {
		c := &http.Client{Transport: v.GuestTransport(h2)}
		r, _ := http.NewRequestWithContext(t.Context(), "GET", "https://api.test/echo", nil)
		r.Header.Set("x-api-key", ph)
		resp, err := c.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		all := fmt.Sprint(resp.Header, resp.Trailer, string(body))
		if strings.Contains(strings.ToLower(all), strings.ToLower(real)) { // names are case-insensitive
			t.Errorf("h2=%v: the real key reached the guest: %s", h2, all)
		}
		if resp.Trailer.Get("X-Tr") == "" || !strings.Contains(string(body), "body ") {
			t.Errorf("h2=%v: no trailer or body came through: %s", h2, all)
		}
	}
	conn := v.GuestConn("api.test", 443)
	defer conn.Close()
	tc := tls.Client(conn, &tls.Config{ServerName: "api.test", RootCAs: v.CA.Pool(), NextProtos: []string{"http/1.1"}})
	io.WriteString(tc, "GET /ws HTTP/1.1\r\nHost: api.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
		"Sec-WebSocket-Key: "+wsKey+"\r\nSec-WebSocket-Version: 13\r\nx-api-key: "+ph+"\r\n\r\n")
	tc.SetDeadline(time.Now().Add(30 * time.Second))
	br := bufio.NewReader(tc)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 101 {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	got, _ := io.ReadAll(br) // text, ping, close; then the connection ends
	if strings.Contains(string(got), real) {
		t.Errorf("the real key reached the guest in a WebSocket frame: %q", got)
	}
	if !strings.Contains(string(got), "text ") {
		t.Errorf("the WebSocket text message did not come through: %q", got)
	}
}

func wsAccept(key string) string {
	h := sha1.Sum([]byte(key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"))
	return base64.StdEncoding.EncodeToString(h[:])
}

// TestMitmdumpCrash: mitmdump killed mid-session: the open connection ends,
// an alert says so, and every later connection is refused without reaching
// the upstream.
func TestMitmdumpCrash(t *testing.T) {
	t.Parallel()
	v := newEngineEnv(t, "mitmproxy", mitmtest.Rules)
	m := v.Eng.(*mitmproxy.Engine)
	var hits atomic.Int64
	v.UpstreamTLS("api.test", 443, v.UpCA, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		mitmtest.EchoInfo(w, r)
	}))
	c := &http.Client{Transport: v.GuestTransport(false)}
	if resp, _ := mitmtest.GetBody(t, c, "https://api.test/before"); resp.StatusCode != 200 {
		t.Fatalf("before the crash: %d", resp.StatusCode)
	}
	proc, err := os.FindProcess(m.Pid())
	if err == nil {
		err = proc.Kill()
	}
	if err != nil {
		t.Fatal(err)
	}
	ev := v.Events.Wait(t, "mitmdump exit", func(e egress.Event) bool { return e.Kind == "proxy" && e.Decision == "deny" })
	if !strings.Contains(ev.Reason, "mitmdump exited unexpectedly") {
		t.Errorf("alert reason: %q", ev.Reason)
	}
	before := hits.Load()
	for _, h2 := range []bool{false, true} {
		c := &http.Client{Transport: v.GuestTransport(h2)}
		req, _ := http.NewRequestWithContext(t.Context(), "GET", "https://api.test/after", nil)
		if resp, err := c.Do(req); err == nil {
			resp.Body.Close()
			t.Fatalf("a request went through after mitmdump died: %d", resp.StatusCode)
		}
	}
	v.Events.Wait(t, "refused connection", func(e egress.Event) bool {
		return e.Kind == "connect" && e.Decision == "deny" && strings.Contains(e.Reason, "mitmdump is not running")
	})
	if hits.Load() != before {
		t.Errorf("the upstream was reached after mitmdump died")
	}
	found := false
	for _, a := range v.alerts() {
		if a["kind"] == "proxy" && strings.Contains(fmt.Sprint(a["reason"]), "mitmdump exited unexpectedly") {
			found = true
		}
	}
	if !found {
		t.Error("no alert in alerts.jsonl for mitmdump's exit")
	}
}

// TestInspectNoRealKey: with --inspect, the live view is bound to the
// session's token (any other local program gets 403 on every endpoint),
// and after swapped requests (HTTP/1, HTTP/2, a WebSocket whose provider
// echoes the key in a text message, a ping and a close reason) its REST
// API and event log hold no real key: /flows and /flows/dump show the
// guest's placeholder, /events no ping payload.
func TestInspectNoRealKey(t *testing.T) {
	t.Parallel()
	mitmwebProbe.Skip(t)
	v, real, ph := swapEnv(t, func(c *mitmproxy.Config) { c.LiveView = true })
	m := v.Eng.(*mitmproxy.Engine)
	v.UpstreamTLS("api.test", 443, v.UpCA, http.HandlerFunc(echoKey))
	base, _, ok := strings.Cut(m.WebURL(), "?")
	if !ok {
		t.Fatalf("the live view's URL %q carries no token", m.WebURL())
	}
	for _, p := range []string{"", "flows", "flows/dump", "events", "updates", "options", "filter-help"} {
		resp, err := http.Get(base + p)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("GET /%s without the token: %d, want 403", p, resp.StatusCode)
		}
	}
	jar, _ := cookiejar.New(nil)
	web := &http.Client{Jar: jar, Timeout: 30 * time.Second}
	get := func(p string) string {
		t.Helper()
		resp, err := web.Get(base + p)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("GET /%s with the token's cookie: %d", p, resp.StatusCode)
		}
		return string(b)
	}
	resp, err := web.Get(m.WebURL())
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("the printed URL: %v %v", resp, err)
	}
	resp.Body.Close()
	for _, h2 := range []bool{false, true} {
		c := &http.Client{Transport: v.GuestTransport(h2)}
		r, _ := http.NewRequestWithContext(t.Context(), "POST", fmt.Sprintf("https://api.test/echo?h2=%v", h2), strings.NewReader("q"))
		r.Header.Set("x-api-key", ph)
		resp, err := c.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	conn := v.GuestConn("api.test", 443)
	defer conn.Close()
	tc := tls.Client(conn, &tls.Config{ServerName: "api.test", RootCAs: v.CA.Pool(), NextProtos: []string{"http/1.1"}})
	tc.SetDeadline(time.Now().Add(30 * time.Second))
	io.WriteString(tc, "GET /ws HTTP/1.1\r\nHost: api.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
		"Sec-WebSocket-Key: "+wsKey+"\r\nSec-WebSocket-Version: 13\r\nx-api-key: "+ph+"\r\n\r\n")
	io.ReadAll(tc) // the provider's frames, until it closes
	// Every flow listed, the ping logged: then nothing more comes.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		flows, events := get("flows"), get("events")
		if strings.Count(flows, "/echo?h2=") == 2 && strings.Contains(flows, `"/ws"`) && strings.Contains(events, "WebSocket ping") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the live view never listed every flow and the ping:\n%s\n%s", egress.Shorten(flows), egress.Shorten(events))
		}
	}
	for _, p := range []string{"flows", "flows/dump", "events"} {
		body := get(p)
		if strings.Contains(strings.ToLower(body), strings.ToLower(real)) {
			t.Errorf("GET /%s holds the real key (%d times)", p, strings.Count(strings.ToLower(body), strings.ToLower(real)))
		}
		if p == "flows" && !strings.Contains(body, ph) {
			t.Errorf("GET /flows does not show the guest's placeholder")
		}
	}
}
