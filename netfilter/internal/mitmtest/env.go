// Package mitmtest is the test harness of the MITM engines: a test "guest"
// on one side, loopback upstream servers with certificates from their own
// CA on the other, a fake resolver, a recording event sink, and the engine
// configuration that joins them. It builds the Go engine itself (NewGo);
// the mitmproxy engine's tests build theirs on the same Env, and netfilter's
// tests add the network logs and the filters. It is imported only by tests
// and holds no test of its own; it imports netfilter/mitm, so the Go
// engine's own tests that use it are external (package mitm_test).
//
// No test reaches outside this machine through it: the raw dialer behind
// the engine's dial guard connects only to loopback and the addresses the
// test names as the host's own.
package mitmtest

import (
	"github.com/vibedom/vibedom/netfilter/egress"
	"github.com/vibedom/vibedom/netfilter/internal/nftest"
	"github.com/vibedom/vibedom/netfilter/mitm"
	"github.com/vibedom/vibedom/netfilter/netstack"

	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vibedom/vibedom/keys"
)

// Rules is the egress policy most engine tests run under.
const Rules = `api.test
*.wild.test
plain.test:80
ssh.test:22
opaque.test:7000
api.test:8443
192.0.2.10
`

// Env is an engine between a test "guest" and loopback upstream servers
// that present certificates from their own CA. New makes it without an
// engine; the caller builds one from Config and sets Eng and Guard (NewGo
// does both for the Go engine).
type Env struct {
	t      *testing.T
	CA     *keys.CA // the vibedom CA the guest trusts
	UpCA   *keys.CA // the upstream servers' CA (the engine trusts it as an extra root)
	Policy *egress.Policy
	Events *Sink
	// Dir is a temporary folder of the test's (the CAs are in it).
	Dir string
	// Eng is the engine under test; Guard is its dial guard.
	Eng   netstack.Engine
	Guard *egress.DialGuard
	mu    sync.Mutex
	dns   map[string][]netip.Addr // what the fake resolver answers
	hosts []netip.Addr            // the host's own addresses, as the guard sees them
}

// New makes an Env whose policy is rules, with no engine yet.
func New(t *testing.T, rules string) *Env {
	t.Helper()
	dir := t.TempDir()
	ca, err := keys.EnsureCA(filepath.Join(dir, "ca"))
	if err != nil {
		t.Fatal(err)
	}
	upCA, err := keys.EnsureCA(filepath.Join(dir, "upstream-ca"))
	if err != nil {
		t.Fatal(err)
	}
	rs, err := egress.ParseRules(strings.NewReader(rules), "test")
	if err != nil {
		t.Fatal(err)
	}
	return &Env{t: t, CA: ca, UpCA: upCA, Policy: egress.NewPolicy(rs), Events: &Sink{}, Dir: dir, dns: map[string][]netip.Addr{}}
}

// T is the test v belongs to.
func (v *Env) T() *testing.T { return v.t }

// Config is the engine configuration that joins the engine to v: the
// vibedom CA, the policy, v.Events, the fake resolver and the loopback-only
// dialer behind the dial guard, the upstream CA as the only root.
func (v *Env) Config() mitm.EngineConfig {
	return mitm.EngineConfig{
		CA:            v.CA,
		Policy:        v.Policy,
		Events:        v.Events,
		Dial:          v.DialUpstream,
		LookupIP:      v.Lookup,
		HostAddrs:     v.HostAddrs,
		AllowPrivate:  v.Policy.PrivateRanges(),
		ExtraRoots:    []*x509.Certificate{v.UpCA.Certificate()},
		NoSystemRoots: true,
	}
}

// NewGo is New with a Go engine built from Config, changed by opts.
func NewGo(t *testing.T, rules string, opts ...func(*mitm.EngineConfig)) (*Env, *mitm.GoEngine) {
	t.Helper()
	v := New(t, rules)
	cfg := v.Config()
	for _, o := range opts {
		o(&cfg)
	}
	e, err := mitm.NewGoEngine(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	v.Eng, v.Guard = e, e.Guard()
	return v, e
}

// DialUpstream is the raw dialer behind the engine's dial guard: it
// connects only to this machine (loopback, unspecified, the addresses
// v.hosts names), so no test can reach outside it whatever the guard lets
// through, and a test sees what the guard wrongly let through.
func (v *Env) DialUpstream(ctx context.Context, network, addr string) (net.Conn, error) {
	ap, err := netip.ParseAddrPort(addr)
	v.mu.Lock()
	local := err == nil && (ap.Addr().Unmap().IsLoopback() || ap.Addr().IsUnspecified() || ap.Addr().Unmap().IsUnspecified() ||
		slices.Contains(v.hosts, ap.Addr().Unmap()))
	v.mu.Unlock()
	if !local {
		return nil, &net.OpError{Op: "dial", Net: network, Err: &net.DNSError{Err: "not a test host", Name: addr, IsNotFound: true}}
	}
	var d net.Dialer
	return d.DialContext(ctx, network, addr)
}

// Lookup is the fake resolver: names answer what v.dns says, nothing else
// exists.
func (v *Env) Lookup(_ context.Context, name string) ([]netip.Addr, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if as, ok := v.dns[name]; ok {
		return slices.Clone(as), nil
	}
	return nil, &net.DNSError{Err: "no such test host", Name: name, IsNotFound: true}
}

// HostAddrs is the host's own addresses as the dial guard sees them (none
// unless SetHostAddrs named some).
func (v *Env) HostAddrs() ([]netip.Addr, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	return slices.Clone(v.hosts), nil
}

// Answer makes the fake resolver answer name with addrs.
func (v *Env) Answer(name string, addrs ...string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, a := range addrs {
		v.dns[name] = append(v.dns[name], netip.MustParseAddr(a))
	}
}

// UpstreamTLS starts a TLS server for name (and whatever SNI it is asked
// for) with a certificate from certCA, reachable from the engine as
// name:port.
func (v *Env) UpstreamTLS(name string, port uint16, certCA *keys.CA, h http.Handler) *httptest.Server {
	v.t.Helper()
	s := httptest.NewUnstartedServer(h)
	s.Config.ErrorLog = log.New(io.Discard, "", 0)
	s.EnableHTTP2 = true
	s.TLS = &tls.Config{GetCertificate: func(hi *tls.ClientHelloInfo) (*tls.Certificate, error) {
		n := hi.ServerName
		if n == "" {
			n = name
		}
		return certCA.IssueLeaf(n, time.Hour)
	}}
	s.StartTLS()
	v.t.Cleanup(s.Close)
	v.AddServer(name, port, s.Listener.Addr().String())
	return s
}

// UpstreamPlain starts a plain HTTP server reachable as name:port.
func (v *Env) UpstreamPlain(name string, port uint16, h http.Handler) *httptest.Server {
	s := httptest.NewServer(h)
	v.t.Cleanup(s.Close)
	v.AddServer(name, port, s.Listener.Addr().String())
	return s
}

// AddServer pins name:port to the loopback address addr, as --resolve does.
func (v *Env) AddServer(name string, port uint16, addr string) {
	n := name
	if ip, ok := egress.ParseAddr(name); ok {
		n = ip.String()
	}
	v.Guard.Pin(n, port, netip.MustParseAddrPort(addr))
}

// GuestConn plays a guest connection admitted for name:port: the returned
// conn is the guest's end; the engine serves the other end. The admission
// decision is the policy's, as the network stack would make it.
func (v *Env) GuestConn(name string, port uint16) net.Conn {
	v.t.Helper()
	c, s := nftest.TCPPair(v.t)
	d := v.Policy.Decide(name, port)
	t := netstack.Target{Name: name, Port: port, Decision: d,
		Guest:   netip.MustParseAddrPort("10.0.2.15:40000"),
		Dialled: netip.MustParseAddrPort("198.18.0.1:" + strconv.Itoa(int(port)))}
	if ip, ok := egress.ParseAddr(name); ok {
		t.Name = ip.String()
	}
	ctx := v.t.Context()
	go v.Eng.HandleConn(ctx, s, t)
	return c
}

// GuestTransport is an http.Transport whose connections are guest
// connections to the engine (transparent mode), trusting only the vibedom CA.
func (v *Env) GuestTransport(h2 bool) *http.Transport {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			host, ps, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, err
			}
			p, _ := strconv.Atoi(ps)
			return v.GuestConn(strings.Trim(host, "[]"), uint16(p)), nil
		},
		TLSClientConfig:   &tls.Config{RootCAs: v.CA.Pool()},
		ForceAttemptHTTP2: h2,
	}
	if !h2 {
		tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
	}
	v.t.Cleanup(tr.CloseIdleConnections)
	return tr
}

// ProxyListener serves the explicit proxy on a loopback port and returns
// its URL.
func (v *Env) ProxyListener() *url.URL {
	v.t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		v.t.Fatal(err)
	}
	v.t.Cleanup(func() { ln.Close() })
	ctx := v.t.Context()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			src := netip.MustParseAddrPort(c.RemoteAddr().String())
			go v.Eng.HandleProxyConn(ctx, c, src)
		}
	}()
	return &url.URL{Scheme: "http", Host: ln.Addr().String()}
}

// Sink keeps events in memory and lets tests wait for one.
type Sink struct {
	mu     sync.Mutex
	events []egress.Event
	cond   chan struct{}
}

func (m *Sink) Record(e egress.Event) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.events = append(m.events, e)
	if m.cond != nil {
		close(m.cond)
		m.cond = nil
	}
}

func (m *Sink) All() []egress.Event {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.events)
}

// Reset forgets the events recorded so far.
func (m *Sink) Reset() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.events = nil
}

// Wait returns the first event matching pred, waiting for it to be recorded
// (events are recorded when a request or connection ends, which can be just
// after the client has its answer). It fails the test after a generous
// guard time.
func (m *Sink) Wait(t *testing.T, what string, pred func(egress.Event) bool) egress.Event {
	t.Helper()
	return m.WaitCount(t, what, 1, pred)[0]
}

// WaitCount waits until at least n recorded events match pred and returns
// them. Tests that count what reaches alerts.jsonl call it first: an event
// is recorded when its connection's handler finishes, which can be after the
// client has seen the refusal, and one recorded after the log is closed is
// lost.
func (m *Sink) WaitCount(t *testing.T, what string, n int, pred func(egress.Event) bool) []egress.Event {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		m.mu.Lock()
		var got []egress.Event
		for _, e := range m.events {
			if pred(e) {
				got = append(got, e)
			}
		}
		if len(got) >= n {
			m.mu.Unlock()
			return got
		}
		if m.cond == nil {
			m.cond = make(chan struct{})
		}
		c := m.cond
		m.mu.Unlock()
		select {
		case <-c:
		case <-deadline:
			if n == 1 {
				t.Fatalf("no %s event; have %+v", what, m.All())
			}
			t.Fatalf("%d %s events recorded, want %d; have %+v", len(got), what, n, m.All())
		}
	}
}

// IsKind matches the events of one kind and decision.
func IsKind(kind, decision string) func(egress.Event) bool {
	return func(e egress.Event) bool { return e.Kind == kind && e.Decision == decision }
}

// SetHostAddrs makes addrs the host's own addresses as the dial guard sees
// them.
func (v *Env) SetHostAddrs(addrs ...netip.Addr) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.hosts = slices.Clone(addrs)
}

// EchoInfo answers with what the upstream saw.
func EchoInfo(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("X-Upstream-Proto", r.Proto)
	w.Header().Set("X-Upstream-Host", r.Host)
	fmt.Fprintf(w, "hello from %s %s", r.Host, r.URL.RequestURI())
}

// GetBody GETs url with c and returns the response and its whole body.
func GetBody(t *testing.T, c *http.Client, url string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), "GET", url, nil)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b)
}

// PatternReader yields N bytes of a repeating pattern without holding them.
type PatternReader struct{ N int64 }

var pattern = func() []byte {
	b := make([]byte, 64<<10)
	for i := range b {
		b[i] = byte('a' + i%26)
	}
	return b
}()

func (p *PatternReader) Read(b []byte) (int, error) {
	if p.N <= 0 {
		return 0, io.EOF
	}
	if int64(len(b)) > p.N {
		b = b[:p.N]
	}
	n := copy(b, pattern)
	p.N -= int64(n)
	return n, nil
}

// ServerFirstEcho starts a server-speaks-first echo service on loopback
// (like SSH or SMTP: a banner, then every byte back) and returns its
// address.
func ServerFirstEcho(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.WriteString(c, "SSH-2.0-test\r\n")
				io.Copy(c, c)
			}()
		}
	}()
	return ln.Addr().String()
}

// TalkServerFirst is a client of ServerFirstEcho on conn (a TCP
// connection): it reads the banner, has one line echoed, half-closes and
// reads to the end.
func TalkServerFirst(t *testing.T, conn net.Conn) {
	t.Helper()
	br := bufio.NewReader(conn)
	line, err := br.ReadString('\n')
	if err != nil || line != "SSH-2.0-test\r\n" {
		t.Fatalf("banner: got %q, %v", line, err)
	}
	io.WriteString(conn, "ping\n")
	if got, _ := br.ReadString('\n'); got != "ping\n" {
		t.Errorf("echo: got %q", got)
	}
	conn.(*net.TCPConn).CloseWrite()
	io.Copy(io.Discard, br)
}
