package netfilter

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vibedom/vibedom/credentials"
	"github.com/vibedom/vibedom/dlp"
	"github.com/vibedom/vibedom/netfilter/internal/mitmtest"
	"github.com/vibedom/vibedom/netfilter/mitm"
)

// TestLoginSwapTrailerAdv (adversarial): a real token the host refreshed
// mid-session (which the DLP, its known values fixed at the start, does
// not know) is refused in a request trailer as it is in a header: in the
// value or the name, declared or not, HTTP/1 and HTTP/2, on both engines,
// a short body or one streamed. The upstream never sees it.
func TestLoginSwapTrailerAdv(t *testing.T) {
	t.Parallel()
	real1 := "sk-ant-oat01-" + strings.Repeat("Rea1", 20) + "AA" // gitleaks:allow
	real2 := "vQ" + strings.Repeat("rEa2tOkN", 10) + "x9"        // gitleaks:allow
	ph := "sk-ant-oat01-" + strings.Repeat("PhAc", 20) + "BB"    // gitleaks:allow
	rph := "sk-ant-ort01-" + strings.Repeat("PhRe", 20) + "BB"   // gitleaks:allow
	forEngines(t, func(t *testing.T, kind string) {
		cred := &fakeLogin{real: []string{real1}, access: []string{ph}, refresh: rph}
		eng, err := dlp.New(dlp.Config{Secrets: []dlp.Secret{{Value: real1, Source: "login"}, {Value: ph, Source: "placeholder"}}})
		if err != nil {
			t.Fatal(err)
		}
		filter := NewSwapFilter(&DLPFilter{Engine: eng, BufferLimit: 64}, []credentials.Swap{{Name: "claude login", Host: "api.test", Header: "authorization", Dynamic: cred}})
		v := newEngineEnv(t, kind, mitmtest.Rules, func(c *mitm.EngineConfig) { c.Filter = filter })
		var mu sync.Mutex
		var got []string
		v.UpstreamTLS("x.wild.test", 443, v.UpCA, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			mu.Lock()
			got = append(got, fmt.Sprintf("%s %v %v %s", r.URL.Path, r.Header, r.Trailer, b))
			mu.Unlock()
			io.WriteString(w, "ok")
		}))
		cred.mu.Lock()
		cred.real = append(cred.real, real2) // the host refreshed
		cred.mu.Unlock()
		long := strings.Repeat("streamed past the buffer limit\n", 8)
		for _, h2 := range []bool{false, true} {
			c := &http.Client{Transport: v.GuestTransport(h2)}
			for _, tc := range []struct {
				name, body string
				tr         http.Header
			}{
				{"value", "short", http.Header{"X-Late": {"t=" + real2}}},
				{"value-streamed", long, http.Header{"X-Late": {real2}}},
				{"name", "short", http.Header{"X-" + real2: {"v"}}},
			} {
				t.Run(fmt.Sprintf("h2=%v/%s", h2, tc.name), func(t *testing.T) {
					req, _ := http.NewRequestWithContext(t.Context(), "POST", "https://x.wild.test/"+tc.name, strings.NewReader(tc.body))
					req.Trailer, req.ContentLength = tc.tr, -1
					if resp, err := c.Do(req); err == nil {
						io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
					}
				})
			}
		}
		mu.Lock()
		defer mu.Unlock()
		for _, s := range got {
			if strings.Contains(strings.ToLower(s), strings.ToLower(real2)) {
				t.Errorf("the refreshed token reached the upstream in a trailer: %s", s)
			}
		}
	})
}

// httpRecorder serves HTTP/1.1 over TLS for name:443 on v and records every
// byte it is sent after TLS (the request line, headers, chunked framing,
// trailers), whatever parses them.
type httpRecorder struct {
	mu  sync.Mutex
	raw bytes.Buffer
}

func newHTTPRecorder(t *testing.T, v *dlpEnv, name string) *httpRecorder {
	t.Helper()
	u := &httpRecorder{}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tl := tls.NewListener(ln, &tls.Config{NextProtos: []string{"http/1.1"}, GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
		return v.UpCA.IssueLeaf(name, time.Hour)
	}})
	s := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		io.WriteString(w, "ok")
	})}
	go s.Serve(recordListener{Listener: tl, u: u})
	t.Cleanup(func() { s.Close() })
	v.AddServer(name, 443, ln.Addr().String())
	return u
}

func (u *httpRecorder) bytes() string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.raw.String()
}

type recordListener struct {
	net.Listener
	u *httpRecorder
}

func (l recordListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return recordConn{Conn: c, u: l.u}, nil
}

type recordConn struct {
	net.Conn
	u *httpRecorder
}

func (c recordConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.u.mu.Lock()
	c.u.raw.Write(p[:n])
	c.u.mu.Unlock()
	return n, err
}

// rawGuestRequest sends req, bytes as written, on a guest TLS connection
// (HTTP/1.1) to name:443 and returns the response's status (0 when there
// was none).
func rawGuestRequest(t *testing.T, v *dlpEnv, name, req string) int {
	t.Helper()
	tc := tls.Client(v.GuestConn(name, 443), &tls.Config{ServerName: name, RootCAs: v.CA.Pool(), NextProtos: []string{"http/1.1"}})
	defer tc.Close()
	tc.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.WriteString(tc, req); err != nil {
		return 0
	}
	resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
	if err != nil {
		return 0
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// TestRequestTrailersRawAdv (adversarial): HTTP/1 request trailers written
// by hand, as no well-behaved client writes them (not declared, on an
// empty body, folded, named as framing or credential headers, repeated,
// beside chunk extensions), never carry a known secret to the upstream,
// on either engine. The oracle is every byte the upstream read.
func TestRequestTrailersRawAdv(t *testing.T) {
	t.Parallel()
	forEngines(t, func(t *testing.T, kind string) {
		v := newDLPEnvEngine(t, kind, 1024)
		ups := map[string]*httpRecorder{"registry.example.net": newHTTPRecorder(t, v, "registry.example.net")}
		head := func(host, extra string) string {
			return "POST /t HTTP/1.1\r\nHost: " + host + "\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n" + extra + "\r\n"
		}
		for _, c := range []struct{ name, host, req string }{
			{"undeclared", "registry.example.net", head("registry.example.net", "") + "5\r\nhello\r\n0\r\nX-Sec: " + dlpSecret + "\r\n\r\n"},
			{"declared-and-not", "registry.example.net", head("registry.example.net", "Trailer: X-A\r\n") + "5\r\nhello\r\n0\r\nX-A: fine\r\nX-Sec: " + dlpSecret + "\r\n\r\n"},
			{"empty-body", "registry.example.net", head("registry.example.net", "Trailer: X-A\r\n") + "0\r\nX-A: " + dlpSecret + "\r\n\r\n"},
			{"folded", "registry.example.net", head("registry.example.net", "Trailer: X-A\r\n") + "5\r\nhello\r\n0\r\nX-A: fine\r\n " + dlpSecret + "\r\n\r\n"},
			{"repeated", "registry.example.net", head("registry.example.net", "Trailer: X-A\r\n") + "5\r\nhello\r\n0\r\nX-A: fine\r\nX-A: " + dlpSecret + "\r\n\r\n"},
			{"framing-names", "registry.example.net", head("registry.example.net", "Trailer: Content-Type, X-A\r\n") + "5\r\nhello\r\n0\r\nContent-Type: " + dlpSecret + "\r\nHost: " + dlpSecret + "\r\nContent-Length: 5\r\nX-A: 1\r\n\r\n"},
			{"chunk-extension", "registry.example.net", head("registry.example.net", "") + "5;x=" + dlpSecret + "\r\nhello\r\n0;y=" + dlpSecret + "\r\n\r\n"},
		} {
			t.Run(c.name, func(t *testing.T) {
				code := rawGuestRequest(t, v, c.host, c.req)
				t.Logf("status %d", code)
				if raw := ups[c.host].bytes(); strings.Contains(strings.ToLower(raw), strings.ToLower(dlpSecret)) {
					t.Errorf("status %d; the secret reached the upstream:\n%s", code, raw)
				}
			})
		}
		// A Go client writes every trailer in its map once the body has
		// ended, declared or not: over HTTP/2 as well.
		for _, h2 := range []bool{false, true} {
			t.Run(fmt.Sprintf("undeclared-client/h2=%v", h2), func(t *testing.T) {
				c := &http.Client{Transport: v.GuestTransport(h2)}
				pr, pw := io.Pipe()
				req, _ := http.NewRequestWithContext(t.Context(), "POST", "https://registry.example.net/u", pr)
				req.Header.Set("Content-Type", "text/plain")
				req.Trailer = http.Header{"X-A": nil}
				go func() {
					pw.Write([]byte("body"))
					req.Trailer.Set("X-A", "fine")
					req.Trailer.Set("X-Undeclared", "k "+dlpSecret)
					pw.Close()
				}()
				code := 0
				if resp, err := c.Do(req); err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					code = resp.StatusCode
				}
				t.Logf("status %d", code)
				if raw := ups["registry.example.net"].bytes(); strings.Contains(strings.ToLower(raw), strings.ToLower(dlpSecret)) {
					t.Errorf("status %d; the secret reached the upstream:\n%s", code, raw)
				}
			})
		}
	})
}

// TestExplicitProxyTrailersAdv (adversarial): plain http:// requests
// through the explicit proxy (absolute-form, served by the Go forwarder in
// both engines) carry no known secret in a trailer, declared or not.
func TestExplicitProxyTrailersAdv(t *testing.T) {
	t.Parallel()
	forEngines(t, func(t *testing.T, kind string) {
		v := newDLPEnvEngine(t, kind, 1024)
		var mu sync.Mutex
		var got []string
		v.UpstreamPlain("registry.example.net", 80, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			mu.Lock()
			got = append(got, fmt.Sprintf("%s %v %v %s", r.URL.Path, r.Header, r.Trailer, b))
			mu.Unlock()
			io.WriteString(w, "ok")
		}))
		pu := v.ProxyListener()
		c := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(pu)}}
		pr, pw := io.Pipe()
		req, _ := http.NewRequestWithContext(t.Context(), "POST", "http://registry.example.net/declared", pr)
		req.Trailer = http.Header{"X-Late": nil}
		go func() {
			pw.Write([]byte("body"))
			req.Trailer.Set("X-Late", "k "+dlpSecret)
			req.Trailer.Set("X-Undeclared", "k "+dlpSecret)
			pw.Close()
		}()
		if resp, err := c.Do(req); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			t.Logf("status %d", resp.StatusCode)
		}
		// Hand-written, undeclared, on the proxy connection.
		conn, err := net.Dial("tcp", pu.Host)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(30 * time.Second))
		io.WriteString(conn, "POST http://registry.example.net/raw HTTP/1.1\r\nHost: registry.example.net\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nbody\r\n0\r\nX-Sec: "+dlpSecret+"\r\n\r\n")
		if resp, err := http.ReadResponse(bufio.NewReader(conn), nil); err == nil {
			t.Logf("raw status %d", resp.StatusCode)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(got) == 0 {
			t.Fatalf("nothing reached the upstream: the test proves nothing")
		}
		for _, s := range got {
			if strings.Contains(s, dlpSecret) {
				t.Errorf("the secret reached the upstream: %s", s)
			}
		}
	})
}

// TestCredentialNamedTrailersAdv (adversarial): credential headers get a
// lighter scan (known values only; to an AI API, logged rather than
// redacted) because the agent signs in with them. A trailer is never how
// anything signs in, yet a trailer named Cookie or X-Api-Key got the same
// pass: a known secret to the AI API, or an e-mail address anywhere, went
// out as it was. Trailers get the destination's whole policy.
func TestCredentialNamedTrailersAdv(t *testing.T) {
	t.Parallel()
	forEngines(t, func(t *testing.T, kind string) {
		v := newDLPEnvEngine(t, kind, 1024)
		ups := map[string]*httpRecorder{}
		for _, n := range []string{"api.anthropic.com", "registry.example.net"} {
			ups[n] = newHTTPRecorder(t, v, n)
		}
		for _, c := range []struct{ name, host, trailers, value string }{
			{"known value to the AI API", "api.anthropic.com", "Cookie: s=" + dlpSecret + "\r\nX-Api-Key: " + dlpSecret + "\r\n", dlpSecret},
			{"email anywhere", "registry.example.net", "Cookie: who=bob@corp.io\r\nX-Auth-Token: bob@corp.io\r\n", "bob@corp.io"},
		} {
			t.Run(c.name, func(t *testing.T) {
				req := "POST /t HTTP/1.1\r\nHost: " + c.host + "\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\nTrailer: Cookie, X-Api-Key, X-Auth-Token\r\n\r\n5\r\nhello\r\n0\r\n" + c.trailers + "\r\n"
				code := rawGuestRequest(t, v, c.host, req)
				raw := ups[c.host].bytes()
				if !strings.Contains(raw, "hello") {
					t.Fatalf("status %d: nothing reached the upstream", code)
				}
				if strings.Contains(raw, c.value) {
					t.Errorf("status %d; the value reached the upstream in a credential-named trailer:\n%s", code, raw)
				}
			})
		}
	})
}
