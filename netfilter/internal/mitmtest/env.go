package netfilter

import (
	"github.com/vibedom/vibedom/netfilter/egress"
	"github.com/vibedom/vibedom/netfilter/netstack"

	"context"
	"crypto/tls"
	"crypto/x509"
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

// testEnv is a vibedom engine between a test "guest" and loopback upstream
// servers that present certificates from their own CA.
type testEnv struct {
	t      *testing.T
	ca     *keys.CA // the vibedom CA the guest trusts
	upCA   *keys.CA // the upstream servers' CA (the engine trusts it as an extra root)
	policy *egress.Policy
	engine *GoEngine       // the Go engine (also the mitmproxy engine's front end)
	eng    netstack.Engine // the engine under test: engine, or a *MitmproxyEngine
	guard  *egress.DialGuard
	events *memSink
	log    *LogWriter
	logDir string
	mu     sync.Mutex
	dns    map[string][]netip.Addr // what the fake resolver answers
	hosts  []netip.Addr            // the host's own addresses, as the guard sees them
}

type envOption func(*EngineConfig)

func newTestEnv(t *testing.T, rules string, opts ...envOption) *testEnv {
	t.Helper()
	return newEngineEnv(t, "go", rules, opts...)
}

// newEngineEnv is newTestEnv with the engine named: "go" or "mitmproxy"
// (skipped, with the reason, when mitmdump is missing).
func newEngineEnv(t *testing.T, kind, rules string, opts ...envOption) *testEnv {
	t.Helper()
	return newMitmEnv(t, kind, rules, nil, opts...)
}

// newMitmEnv is newEngineEnv with mopt, when not nil, changing the
// mitmproxy engine's own configuration.
func newMitmEnv(t *testing.T, kind, rules string, mopt func(*MitmproxyConfig), opts ...envOption) *testEnv {
	t.Helper()
	if kind == "mitmproxy" {
		skipWithoutMitmdump(t)
	}
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
	v := &testEnv{t: t, ca: ca, upCA: upCA, policy: egress.NewPolicy(rs), events: &memSink{}, logDir: dir, dns: map[string][]netip.Addr{}}
	v.log, err = NewLogWriter(filepath.Join(dir, NetworkLogFile), filepath.Join(dir, AlertsLogFile))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { v.log.Close() })
	cfg := EngineConfig{
		CA:            ca,
		Policy:        v.policy,
		Events:        egress.EventSinkFunc(func(e egress.Event) { v.log.Record(e); v.events.Record(e) }),
		Dial:          v.dialUpstream,
		LookupIP:      v.lookup,
		HostAddrs:     v.hostAddrs,
		AllowPrivate:  v.policy.PrivateRanges(),
		ExtraRoots:    []*x509.Certificate{upCA.Certificate()},
		NoSystemRoots: true,
	}
	for _, o := range opts {
		o(&cfg)
	}
	if kind == "mitmproxy" {
		mcfg := MitmproxyConfig{EngineConfig: cfg, CAKeyFile: filepath.Join(dir, "ca", keys.CAKeyFile), RuntimeDir: dir}
		if mopt != nil {
			mopt(&mcfg)
		}
		m, err := NewMitmproxyEngine(t.Context(), mcfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		v.engine, v.eng, v.guard = m.front, m, m.guard
		return v
	}
	v.engine, err = NewGoEngine(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { v.engine.Close() })
	v.eng, v.guard = v.engine, v.engine.guard
	return v
}

// dialUpstream is the raw dialer behind the engine's dial guard: it
// connects only to this machine (loopback, unspecified, the addresses
// v.hosts names), so no test can reach outside it whatever the guard lets
// through, and a test sees what the guard wrongly let through.
func (v *testEnv) dialUpstream(ctx context.Context, network, addr string) (net.Conn, error) {
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

// lookup is the fake resolver: names answer what v.dns says, nothing else
// exists.
func (v *testEnv) lookup(_ context.Context, name string) ([]netip.Addr, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if as, ok := v.dns[name]; ok {
		return slices.Clone(as), nil
	}
	return nil, &net.DNSError{Err: "no such test host", Name: name, IsNotFound: true}
}

func (v *testEnv) hostAddrs() ([]netip.Addr, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	return slices.Clone(v.hosts), nil
}

// answer makes the fake resolver answer name with addrs.
func (v *testEnv) answer(name string, addrs ...string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, a := range addrs {
		v.dns[name] = append(v.dns[name], netip.MustParseAddr(a))
	}
}

// upstreamTLS starts a TLS server for name (and whatever SNI it is asked
// for) with a certificate from certCA, reachable from the engine as
// name:port.
func (v *testEnv) upstreamTLS(name string, port uint16, certCA *keys.CA, h http.Handler) *httptest.Server {
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
	v.addServer(name, port, s.Listener.Addr().String())
	return s
}

// upstreamPlain starts a plain HTTP server reachable as name:port.
func (v *testEnv) upstreamPlain(name string, port uint16, h http.Handler) *httptest.Server {
	s := httptest.NewServer(h)
	v.t.Cleanup(s.Close)
	v.addServer(name, port, s.Listener.Addr().String())
	return s
}

// addServer pins name:port to the loopback address addr, as --resolve does.
func (v *testEnv) addServer(name string, port uint16, addr string) {
	n := name
	if ip, ok := egress.ParseAddr(name); ok {
		n = ip.String()
	}
	v.guard.Pin(n, port, netip.MustParseAddrPort(addr))
}

// tcpPair returns the two ends of a loopback TCP connection.
func tcpPair(t testing.TB) (client, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type res struct {
		c   net.Conn
		err error
	}
	ch := make(chan res, 1)
	go func() { c, err := ln.Accept(); ch <- res{c, err} }()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	r := <-ch
	if r.err != nil {
		t.Fatal(r.err)
	}
	return client, r.c
}

// guestConn plays a guest connection admitted for name:port: the returned
// conn is the guest's end; the engine serves the other end. The admission
// decision is the policy's, as the network stack would make it.
func (v *testEnv) guestConn(name string, port uint16) net.Conn {
	v.t.Helper()
	c, s := tcpPair(v.t)
	d := v.policy.Decide(name, port)
	t := netstack.Target{Name: name, Port: port, Decision: d,
		Guest:   netip.MustParseAddrPort("10.0.2.15:40000"),
		Dialled: netip.MustParseAddrPort("198.18.0.1:" + strconv.Itoa(int(port)))}
	if ip, ok := egress.ParseAddr(name); ok {
		t.Name = ip.String()
	}
	ctx := v.t.Context()
	go v.eng.HandleConn(ctx, s, t)
	return c
}

// guestTransport is an http.Transport whose connections are guest
// connections to the engine (transparent mode), trusting only the vibedom CA.
func (v *testEnv) guestTransport(h2 bool) *http.Transport {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			host, ps, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, err
			}
			p, _ := strconv.Atoi(ps)
			return v.guestConn(strings.Trim(host, "[]"), uint16(p)), nil
		},
		TLSClientConfig:   &tls.Config{RootCAs: v.ca.Pool()},
		ForceAttemptHTTP2: h2,
	}
	if !h2 {
		tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
	}
	v.t.Cleanup(tr.CloseIdleConnections)
	return tr
}

// proxyListener serves the explicit proxy on a loopback port and returns
// its URL.
func (v *testEnv) proxyListener() *url.URL {
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
			go v.eng.HandleProxyConn(ctx, c, src)
		}
	}()
	return &url.URL{Scheme: "http", Host: ln.Addr().String()}
}

// alerts flushes the log and returns the alerts.jsonl lines.
func (v *testEnv) alerts() []map[string]any {
	v.t.Helper()
	v.log.Close()
	return readJSONL(v.t, filepath.Join(v.logDir, AlertsLogFile))
}

// memSink keeps events in memory and lets tests wait for one.
type memSink struct {
	mu     sync.Mutex
	events []egress.Event
	cond   chan struct{}
}

func (m *memSink) Record(e egress.Event) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.events = append(m.events, e)
	if m.cond != nil {
		close(m.cond)
		m.cond = nil
	}
}

func (m *memSink) all() []egress.Event {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.events)
}

// wait returns the first event matching pred, waiting for it to be recorded
// (events are recorded when a request or connection ends, which can be just
// after the client has its answer). It fails the test after a generous
// guard time.
func (m *memSink) wait(t *testing.T, what string, pred func(egress.Event) bool) egress.Event {
	t.Helper()
	return m.waitCount(t, what, 1, pred)[0]
}

// waitCount waits until at least n recorded events match pred and returns
// them. Tests that count what reaches alerts.jsonl call it first: an event
// is recorded when its connection's handler finishes, which can be after the
// client has seen the refusal, and one recorded after the log is closed is
// lost.
func (m *memSink) waitCount(t *testing.T, what string, n int, pred func(egress.Event) bool) []egress.Event {
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
				t.Fatalf("no %s event; have %+v", what, m.all())
			}
			t.Fatalf("%d %s events recorded, want %d; have %+v", len(got), what, n, m.all())
		}
	}
}

func isKind(kind, decision string) func(egress.Event) bool {
	return func(e egress.Event) bool { return e.Kind == kind && e.Decision == decision }
}
