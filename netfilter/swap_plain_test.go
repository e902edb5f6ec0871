package netfilter

import (
	"github.com/vibedom/vibedom/credentials"
	"github.com/vibedom/vibedom/netfilter/egress"
	"github.com/vibedom/vibedom/netfilter/internal/mitmtest"
	"github.com/vibedom/vibedom/netfilter/mitm"

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

	"github.com/vibedom/vibedom/keys"
)

// sniffServer is a fake provider on one loopback port that answers TLS
// (a certificate from its CA) and plain HTTP alike, and keeps every byte
// it was sent in the clear (decrypted for TLS): a request that leaves the
// host in plain HTTP is seen, not refused by a handshake.
type sniffServer struct {
	mu  sync.Mutex
	raw bytes.Buffer
	ln  net.Listener
}

func newSniffServer(t *testing.T, name string, ca *keys.CA, h http.Handler) *sniffServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &sniffServer{ln: ln}
	srv := &http.Server{Handler: h, ErrorLog: nil}
	done := make(chan struct{})
	t.Cleanup(func() { close(done); ln.Close(); srv.Close() })
	cfg := &tls.Config{NextProtos: []string{"http/1.1"}, GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
		return ca.IssueLeaf(name, time.Hour)
	}}
	conns := make(chan net.Conn)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				br := bufio.NewReader(c)
				b, err := br.Peek(1)
				if err != nil {
					c.Close()
					return
				}
				var conn net.Conn = &recConn{Conn: &bufConn{Conn: c, r: br}, s: s}
				if b[0] == 0x16 {
					tc := tls.Server(&bufConn{Conn: c, r: br}, cfg)
					conn = &recConn{Conn: tc, s: s}
				}
				select {
				case conns <- conn:
				case <-done:
					c.Close()
				}
			}()
		}
	}()
	go srv.Serve(&chanListener{c: conns, done: done, addr: ln.Addr()})
	return s
}

func (s *sniffServer) seen() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.raw.String()
}

type bufConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufConn) Read(p []byte) (int, error) { return c.r.Read(p) }

type recConn struct {
	net.Conn
	s *sniffServer
}

func (c *recConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.s.mu.Lock()
	c.s.raw.Write(p[:n])
	c.s.mu.Unlock()
	return n, err
}

type chanListener struct {
	c    chan net.Conn
	done chan struct{}
	addr net.Addr
}

func (l *chanListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.c:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}
func (l *chanListener) Close() error   { return nil }
func (l *chanListener) Addr() net.Addr { return l.addr }

// TestSwapOnlyOverVerifiedTLS (issue 18, item 8): plain HTTP to the
// provider's port 443 never gets the real key, on every path the guest has
// (the explicit proxy's absolute URI, a transparent connection, a CONNECT
// tunnel), and is refused with an alert; the same request over TLS is
// swapped. The fake provider answers TLS and plain HTTP on one port and
// keeps every byte it was sent.
func TestSwapOnlyOverVerifiedTLS(t *testing.T) {
	t.Parallel()
	real, ph, eng := swapFixture(t, "Pl4n", "PhYy")
	filter := NewSwapFilter(&DLPFilter{Engine: eng}, []credentials.Swap{{Name: "anthropic", Host: "api.test", Header: "x-api-key", Placeholder: ph, Value: real, Token: ph}})
	forEngines(t, func(t *testing.T, kind string) {
		v := newEngineEnv(t, kind, mitmtest.Rules, func(c *mitm.EngineConfig) { c.Filter = filter })
		srv := newSniffServer(t, "api.test", v.UpCA, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			io.WriteString(w, "ok")
		}))
		v.AddServer("api.test", 443, srv.ln.Addr().String())
		req := "POST /v1/messages HTTP/1.1\r\nHost: api.test:443\r\nx-api-key: " + ph + "\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"
		// readStatus reads one HTTP response (or nothing, the connection
		// closed) from c.
		readStatus := func(c net.Conn) int {
			c.SetReadDeadline(time.Now().Add(30 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				return 0
			}
			io.Copy(io.Discard, resp.Body)
			return resp.StatusCode
		}
		paths := []struct {
			name string
			send func(t *testing.T) int
		}{
			{"explicit proxy absolute URI", func(t *testing.T) int {
				c, err := net.Dial("tcp", v.ProxyListener().Host)
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				fmt.Fprintf(c, "POST http://api.test:443/v1/messages HTTP/1.1\r\nHost: api.test:443\r\nx-api-key: %s\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}", ph)
				return readStatus(c)
			}},
			{"transparent", func(t *testing.T) int {
				c := v.GuestConn("api.test", 443)
				defer c.Close()
				io.WriteString(c, req)
				return readStatus(c)
			}},
			{"CONNECT tunnel", func(t *testing.T) int {
				c, err := net.Dial("tcp", v.ProxyListener().Host)
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				io.WriteString(c, "CONNECT api.test:443 HTTP/1.1\r\nHost: api.test:443\r\n\r\n")
				br := bufio.NewReader(c)
				c.SetReadDeadline(time.Now().Add(30 * time.Second))
				resp, err := http.ReadResponse(br, nil)
				if err != nil || resp.StatusCode != 200 {
					t.Fatalf("CONNECT: %v %v", resp, err)
				}
				io.WriteString(c, req)
				resp, err = http.ReadResponse(br, nil)
				if err != nil {
					return 0
				}
				io.Copy(io.Discard, resp.Body)
				return resp.StatusCode
			}},
		}
		for _, p := range paths {
			t.Run(p.name, func(t *testing.T) {
				if code := p.send(t); code == 200 {
					t.Errorf("plain HTTP to :443 answered 200")
				}
				if s := srv.seen(); strings.Contains(s, real) {
					t.Fatalf("the provider got the real key in plain HTTP")
				}
			})
		}
		v.Events.Wait(t, "plain-HTTP refusal", func(e egress.Event) bool {
			return e.Decision == "deny" && e.Name == "api.test" && e.Port == 443
		})
		if kind == "go" {
			// The Go engine refuses plain HTTP to :443 whatever it carries,
			// with the reason in the answer and an alert.
			before := len(srv.seen())
			for _, p := range paths {
				req = "GET /v1/models HTTP/1.1\r\nHost: api.test:443\r\nConnection: close\r\n\r\n"
				if code := p.send(t); code != http.StatusForbidden {
					t.Errorf("%s without a key: status %d, want 403", p.name, code)
				}
			}
			if len(srv.seen()) != before {
				t.Errorf("plain HTTP reached the provider's :443: %q", srv.seen()[before:])
			}
			v.Events.WaitCount(t, "plain-HTTP alerts", 6, func(e egress.Event) bool {
				return e.Decision == "deny" && strings.Contains(e.Reason, "plain HTTP to port 443")
			})
		}
		// Over TLS the same request is swapped: the test's provider can see
		// the key when it is sent.
		c := &http.Client{Transport: v.GuestTransport(false), Timeout: time.Minute}
		hr, _ := http.NewRequest("POST", "https://api.test/v1/messages", strings.NewReader("{}"))
		hr.Header.Set("x-api-key", ph)
		resp, err := c.Do(hr)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(srv.seen(), "X-Api-Key: "+real) && !strings.Contains(strings.ToLower(srv.seen()), "x-api-key: "+strings.ToLower(real)) {
			t.Errorf("over verified TLS: status %d, the provider did not get the key", resp.StatusCode)
		}
	})
}
