package mitm

import (
	"github.com/vibedom/vibedom/netfilter/egress"
	"github.com/vibedom/vibedom/netfilter/netstack"

	"slices"

	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"

	"github.com/vibedom/vibedom/keys"
)

// guardConfig is the part of c the dial guard reads.
func (c EngineConfig) guardConfig() egress.GuardConfig {
	return egress.GuardConfig{Dial: c.Dial, LookupIP: c.LookupIP, Resolve: c.Resolve, AllowPrivate: c.AllowPrivate, HostAddrs: c.HostAddrs}
}

// EngineConfig configures the Go MITM engine.
type EngineConfig struct {
	// CA mints the leaf certificates the guest sees. Required.
	CA *keys.CA
	// Policy decides the explicit proxy's CONNECT targets and absolute-URI
	// requests. Required for HandleProxyConn (without it every explicit
	// proxy request is refused); HandleConn trusts Target.Decision.
	Policy egress.Decider
	// Filter rewrites every request before it goes upstream; nil means
	// IdentityFilter.
	Filter RequestFilter
	// Events receives one Event per connection and per request; nil
	// discards them.
	Events egress.EventSink
	// Logger receives diagnostics (never secret values); nil is silent.
	Logger *slog.Logger
	// Every upstream connection goes through one dial guard (see
	// docs/network.md): it resolves names itself (LookupIP), refuses
	// addresses vibedom never connects to (ErrUpstreamAddress) and only
	// then calls Dial with "ip:port".
	//
	// Dial opens a TCP connection to an address the guard has passed; nil
	// uses a net.Dialer whose Control function checks the address again.
	Dial egress.DialFunc
	// LookupIP resolves upstream names; nil asks the host's resolver.
	LookupIP egress.LookupFunc
	// Resolve pins names and ports to addresses (--resolve). A pinned
	// address is dialled for exactly that name and port even when it is
	// loopback or private: the user named it on the command line. Nothing
	// else reaches it.
	Resolve []egress.Resolve
	// AllowPrivate lists the private ranges (RFC 1918, ULA, CGNAT) a
	// user-scope allow-private rule opened; other private addresses are
	// refused.
	AllowPrivate []netip.Prefix
	// HostAddrs lists the host's own addresses, never dialled; nil reads
	// the host's interfaces.
	HostAddrs func() ([]netip.Addr, error)
	// ExtraRoots are trusted for upstream TLS in addition to the system
	// roots.
	ExtraRoots []*x509.Certificate
	// NoSystemRoots trusts only ExtraRoots upstream.
	NoSystemRoots bool
	// LeafValidity is the validity of minted leaf certificates
	// (keys.DefaultLeafValidity when 0).
	LeafValidity time.Duration
	// HandshakeTimeout bounds how long a guest may take to send its first
	// bytes and finish the TLS handshake (10s when 0).
	HandshakeTimeout time.Duration
	// ServerFirstWait is how long a connection to a port other than 80 or
	// 443 may stay silent before it is treated as a server-speaks-first
	// protocol and spliced (500ms when 0).
	ServerFirstWait time.Duration
	// IdleTimeout closes guest HTTP connections idle this long (2m when 0).
	IdleTimeout time.Duration
	// MemoryBudget bounds the memory this engine's requests in flight may
	// hold (DefaultMemoryBudget when 0); a request it cannot cover gets
	// 503. BodyBufferLimit is the largest body the Filter reads whole
	// (DefaultBodyBufferLimit when 0); BodyIdleTimeout abandons a request
	// whose body sends nothing that long (DefaultBodyIdleTimeout when 0).
	MemoryBudget    int64
	BodyBufferLimit int64
	BodyIdleTimeout time.Duration
	// MaxUpstreamConns bounds the upstream connections open at once
	// (DefaultMaxUpstreamConns when 0).
	MaxUpstreamConns int
	// Session names the session in refusals ("vibedom allow SESSION …").
	Session string
	// NoMITM lists names (normalised) whose TLS is passed through to the
	// upstream unmodified, for clients that pin certificates: the
	// ClientHello's SNI must name the admitted name, and the DLP sees
	// nothing of those bytes (the connect event says so). The caller
	// keeps model providers and hosts a credential is swapped for out.
	NoMITM []string
	// Track, when set, is told of every explicit-proxy CONNECT tunnel (and
	// absolute-URI request, while it is served) the engine serves, with its
	// target; the returned function is called when the tunnel ends.
	// Closing conn ends the tunnel (a live deny rule).
	Track func(t netstack.Target, conn net.Conn) (done func())
	// Tunnel, when set, serves the explicit proxy's CONNECT tunnels in
	// place of HandleConn, after the CONNECT was decided and answered (the
	// mitmproxy engine hands them to mitmdump).
	Tunnel func(ctx context.Context, conn net.Conn, t netstack.Target)
}

// NoMITMReason is the connect event's reason for a connection passed
// through uninspected (EngineConfig.NoMITM).
const NoMITMReason = "tunnelled uninspected (no-mitm): TLS passed through unmodified, the DLP saw none of these bytes"

// GoEngine is the default Engine: it terminates the guest's TLS with leaf
// certificates from the vibedom CA, checks that SNI, Host and :authority
// agree with the name the connection was admitted for, runs every request
// through the RequestFilter and forwards it upstream over TLS verified
// against the system roots (plus EngineConfig.ExtraRoots). It speaks
// HTTP/1.1, HTTP/2 and WebSocket and streams bodies both ways; a request
// goes upstream in the HTTP version the guest used (HTTP/2 only when the
// server offers it). Connections that are neither TLS nor HTTP, to ports
// other than 80 and 443, are spliced to upstream uninspected. It also
// serves the explicit proxy (HandleProxyConn). A GoEngine is safe for
// concurrent use.
type GoEngine struct {
	cfg    EngineConfig
	filter RequestFilter
	events egress.EventSink
	log    *slog.Logger
	stdlog *log.Logger
	leaves leafCache
	// transport1 and rp1 serve HTTP/1.x guests, transport2 and rp2 HTTP/2
	// guests.
	transport1, transport2 *http.Transport
	rp1, rp2               *httputil.ReverseProxy
	h2                     *http2.Server
	dial                   egress.DialFunc
	guard                  *egress.DialGuard
	budget                 *Budget
	slots                  *egress.ConnSlots
}

var _ netstack.Engine = (*GoEngine)(nil)

// NewGoEngine checks cfg and builds the engine.
func NewGoEngine(cfg EngineConfig) (*GoEngine, error) {
	if cfg.CA == nil {
		return nil, errors.New("mitm: EngineConfig.CA is required (run `vibedom init` to create the CA)")
	}
	e := &GoEngine{cfg: cfg, filter: cfg.Filter, events: cfg.Events, log: cfg.Logger}
	if e.filter == nil {
		e.filter = IdentityFilter{}
	}
	if e.events == nil {
		e.events = egress.DiscardEvents{}
	}
	if e.log == nil {
		e.log = slog.New(slog.DiscardHandler)
	}
	e.cfg.Filter, e.cfg.Events, e.cfg.Logger = e.filter, e.events, e.log
	if e.cfg.HandshakeTimeout <= 0 {
		e.cfg.HandshakeTimeout = 10 * time.Second
	}
	if e.cfg.ServerFirstWait <= 0 {
		e.cfg.ServerFirstWait = 500 * time.Millisecond
	}
	if e.cfg.IdleTimeout <= 0 {
		e.cfg.IdleTimeout = 2 * time.Minute
	}
	e.stdlog = slog.NewLogLogger(e.log.Handler(), slog.LevelDebug)
	e.leaves = leafCache{ca: cfg.CA, validity: cfg.LeafValidity, m: map[string]*tls.Certificate{}}
	if e.leaves.validity <= 0 {
		e.leaves.validity = keys.DefaultLeafValidity
	}

	var roots *x509.CertPool
	if !cfg.NoSystemRoots {
		sys, err := x509.SystemCertPool()
		if err != nil {
			e.log.Warn("system certificate roots unavailable; trusting only the configured extra roots", "err", err)
		} else {
			roots = sys.Clone()
		}
	}
	if roots == nil {
		roots = x509.NewCertPool()
	}
	for _, c := range cfg.ExtraRoots {
		roots.AddCert(c)
	}
	if e.cfg.MemoryBudget <= 0 {
		e.cfg.MemoryBudget = DefaultMemoryBudget
	}
	if e.cfg.BodyBufferLimit <= 0 {
		e.cfg.BodyBufferLimit = DefaultBodyBufferLimit
	}
	if e.cfg.BodyIdleTimeout <= 0 {
		e.cfg.BodyIdleTimeout = DefaultBodyIdleTimeout
	}
	if e.cfg.MaxUpstreamConns <= 0 {
		e.cfg.MaxUpstreamConns = DefaultMaxUpstreamConns
	}
	e.budget = newBudget(e.cfg.MemoryBudget)
	e.slots = egress.NewConnSlots(e.cfg.MaxUpstreamConns, func() {
		e.transport1.CloseIdleConnections()
		e.transport2.CloseIdleConnections()
	})
	e.guard = egress.NewDialGuard(cfg.guardConfig(), e.events, e.log)
	e.guard.Slots = e.slots
	e.dial = e.guard.DialContext
	// Upstream speaks the protocol the guest chose: HTTP/1.1 for an HTTP/1.x
	// guest, HTTP/2 (when the server offers it) for an h2 guest. Keeping the
	// guest's protocol end to end keeps its semantics (Upgrade, framing)
	// and spares an HTTP/1.1 response the h2 framing, flow-control updates
	// and extra records on both sides.
	tr := func(protos http.Protocols, dial egress.DialFunc) *http.Transport {
		return &http.Transport{
			Proxy:                 nil, // never the host's HTTP(S)_PROXY
			DialContext:           dial,
			TLSClientConfig:       &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12},
			Protocols:             &protos,
			TLSHandshakeTimeout:   15 * time.Second,
			ExpectContinueTimeout: time.Second,
			MaxIdleConns:          e.cfg.MaxUpstreamConns / 2,
			MaxIdleConnsPerHost:   MaxConnsPerHost,
			MaxConnsPerHost:       MaxConnsPerHost,
			IdleConnTimeout:       90 * time.Second,
			DisableCompression:    true, // bodies pass as the server encoded them
			WriteBufferSize:       32 << 10,
			ReadBufferSize:        32 << 10,
		}
	}
	var h1, h2 http.Protocols
	h1.SetHTTP1(true)
	h2.SetHTTP1(true)
	h2.SetHTTP2(true)
	dial1 := func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := e.dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return wrapUpstream(c), nil
	}
	e.transport1, e.transport2 = tr(h1, dial1), tr(h2, e.dial)
	rp := func(t http.RoundTripper) *httputil.ReverseProxy {
		return &httputil.ReverseProxy{
			// The request is prepared in forward; its trailer map (filled
			// and scrubbed as the body ends) is the one sent.
			Rewrite:        func(pr *httputil.ProxyRequest) { pr.Out.Trailer = pr.In.Trailer },
			Transport:      t,
			BufferPool:     bufferPool{},
			ErrorLog:       e.stdlog,
			ErrorHandler:   e.upstreamError,
			ModifyResponse: e.modifyResponse,
		}
	}
	e.rp1, e.rp2 = rp(e.transport1), rp(e.transport2)
	e.h2 = &http2.Server{IdleTimeout: e.cfg.IdleTimeout, MaxConcurrentStreams: MaxStreamsPerConn}
	return e, nil
}

// Config returns the engine's configuration with every default filled in
// (Filter, Events and Logger included).
func (e *GoEngine) Config() EngineConfig { return e.cfg }

// Guard returns the dial guard every upstream connection goes through.
func (e *GoEngine) Guard() *egress.DialGuard { return e.guard }

// Budget returns the memory budget the engine's requests in flight are
// charged to.
func (e *GoEngine) Budget() *Budget { return e.budget }

// UpstreamTransport returns the transport HTTP/1.x requests go upstream
// through (the dial guard's, TLS verified).
func (e *GoEngine) UpstreamTransport() *http.Transport { return e.transport1 }

// ErrorLog returns the standard logger the engine's HTTP servers write to
// (the engine's Logger, at debug level).
func (e *GoEngine) ErrorLog() *log.Logger { return e.stdlog }

// Close releases idle upstream connections.
func (e *GoEngine) Close() error {
	e.transport1.CloseIdleConnections()
	e.transport2.CloseIdleConnections()
	return nil
}

type bufferPool struct{}

var copyBufs = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

func (bufferPool) Get() []byte  { return *copyBufs.Get().(*[]byte) }
func (bufferPool) Put(b []byte) { copyBufs.Put(&b) }

// leafCache keeps one minted certificate per name until half its validity
// has passed. It holds at most maxLeaves names.
type leafCache struct {
	ca       *keys.CA
	validity time.Duration
	mu       sync.Mutex
	m        map[string]*tls.Certificate
}

const maxLeaves = 4096

func (c *leafCache) get(name string) (*tls.Certificate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cert, ok := c.m[name]; ok && time.Until(cert.Leaf.NotAfter) > c.validity/2 {
		return cert, nil
	}
	cert, err := c.ca.IssueLeaf(name, c.validity)
	if err != nil {
		return nil, err
	}
	if len(c.m) >= maxLeaves {
		clear(c.m)
	}
	c.m[name] = cert
	return cert, nil
}

// CountConn counts the bytes read from (up) and written to (down) a guest
// connection.
type CountConn struct {
	net.Conn
	Up, Down atomic.Int64
}

func (c *CountConn) Read(p []byte) (int, error)  { return c.counted().Read(p) }
func (c *CountConn) Write(p []byte) (int, error) { return c.counted().Write(p) }
func (c *CountConn) CloseWrite() error           { return closeWrite(c.Conn) }

// counted is c as a countRW: what the guest sends is read (Up), what it
// is sent is written (Down).
func (c *CountConn) counted() countRW { return countRW{rw: c.Conn, read: &c.Up, written: &c.Down} }

// countRW adds the bytes read from rw to read and those written to it to
// written: the one byte counter of the engine's connections (CountConn)
// and of upgraded (101) ones.
type countRW struct {
	rw            io.ReadWriteCloser
	read, written *atomic.Int64
}

func (c countRW) Read(p []byte) (int, error) {
	n, err := c.rw.Read(p)
	c.read.Add(int64(n))
	return n, err
}

func (c countRW) Write(p []byte) (int, error) {
	n, err := c.rw.Write(p)
	c.written.Add(int64(n))
	return n, err
}

func (c countRW) Close() error      { return c.rw.Close() }
func (c countRW) CloseWrite() error { return closeWrite(c.rw) }

// connOutcome is what HandleConn logs when the connection ends.
type connOutcome struct {
	decision, reason string
}

// HandleConn implements Engine. It blocks until the connection is done and
// closes it. What the guest sends first decides the treatment:
//
//   - a TLS ClientHello: its SNI must equal t.Name (a ClientHello without
//     SNI is accepted only when t.Name is an IP literal); TLS is terminated
//     with a leaf for t.Name, ALPN h2 or http/1.1, and the HTTP inside is
//     proxied;
//   - an HTTP/1.x request line: proxied as plain HTTP;
//   - anything else, or silence for ServerFirstWait, on a port other than
//     80 and 443: spliced to t.Name:t.Port without interception;
//   - anything else on 80 or 443: refused.
//
// Every request's Host (or :authority) must equal t.Name, with t.Port when
// it is not the scheme's default port. One "connect" Event is recorded when
// the connection ends, plus one "request" Event per HTTP request.
func (e *GoEngine) HandleConn(ctx context.Context, conn net.Conn, t netstack.Target) {
	cc := &CountConn{Conn: conn}
	start := time.Now()
	out := e.handleConn(ctx, cc, t)
	cc.Close()
	ev := egress.Event{
		Time:     start,
		Kind:     "connect",
		Name:     t.Name,
		Port:     t.Port,
		Decision: out.decision,
		Rule:     t.Decision.Rule,
		Reason:   out.reason,
		BytesUp:  cc.Up.Load(),
		BytesDn:  cc.Down.Load(),
	}
	if t.Guest.IsValid() {
		ev.Src = t.Guest.String()
	}
	if t.Dialled.IsValid() {
		ev.Dst = t.Dialled.String()
	}
	e.events.Record(ev)
	if out.decision == "deny" {
		e.log.Info("refused guest connection", "name", t.Name, "port", t.Port, "reason", out.reason)
	}
}

func (e *GoEngine) handleConn(ctx context.Context, cc *CountConn, t netstack.Target) connOutcome {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(ctx, func() { cc.Close() })
	defer stop()
	if t.Name == "" || t.Port == 0 || !t.Decision.Allow {
		return connOutcome{"deny", "connection was not admitted by the policy"}
	}
	pc := &PeekConn{Conn: cc}
	webPort := t.Port == 80 || t.Port == 443
	wait := e.cfg.ServerFirstWait
	if webPort {
		wait = e.cfg.HandshakeTimeout
	}
	cc.SetReadDeadline(time.Now().Add(wait))
	err := pc.Fill(1)
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() && !webPort {
			cc.SetReadDeadline(time.Time{})
			return e.splice(ctx, pc, t, "spliced (server speaks first)")
		}
		if errors.As(err, &ne) && ne.Timeout() {
			return connOutcome{"deny", fmt.Sprintf("no TLS or HTTP request within %v on port %d", wait, t.Port)}
		}
		return connOutcome{"allow", "closed before sending anything"}
	}
	switch {
	case pc.buf[0] == 0x16:
		cc.SetReadDeadline(time.Now().Add(e.cfg.HandshakeTimeout))
		return e.serveTLS(ctx, pc, t)
	case LooksLikeHTTP(pc):
		cc.SetReadDeadline(time.Time{})
		bc := &batchConn{Conn: pc}
		e.serveHTTP1(ctx, bc, &connHandler{e: e, t: t, scheme: "http", guest: bc})
		return connOutcome{"allow", "http"}
	case webPort:
		return connOutcome{"deny", fmt.Sprintf("neither TLS nor HTTP on port %d", t.Port)}
	default:
		cc.SetReadDeadline(time.Time{})
		return e.splice(ctx, pc, t, "spliced (neither TLS nor HTTP)")
	}
}

var httpMethods = []string{"GET ", "HEAD ", "POST ", "PUT ", "DELETE ", "OPTIONS ", "PATCH ", "TRACE ", "CONNECT "}

// LooksLikeHTTP reports whether the buffered bytes start an HTTP/1.x
// request line, reading a few more bytes if needed.
func LooksLikeHTTP(pc *PeekConn) bool {
	c := pc.buf[0]
	if c < 'A' || c > 'Z' {
		return false
	}
	for _, m := range httpMethods {
		if m[0] != c {
			continue
		}
		if pc.Fill(len(m)) != nil {
			return false
		}
		if string(pc.buf[:len(m)]) == m {
			return true
		}
	}
	return false
}

func (e *GoEngine) serveTLS(ctx context.Context, pc *PeekConn, t netstack.Target) connOutcome {
	hello, err := peekClientHello(pc)
	if err != nil {
		tlsAlert(pc.Conn, alertAccessDenied)
		return connOutcome{"deny", err.Error()}
	}
	if reason := SNIMismatch(hello.serverName, hello.hasSNI, t.Name); reason != "" {
		tlsAlert(pc.Conn, alertAccessDenied)
		return connOutcome{"deny", reason}
	}
	if slices.Contains(e.cfg.NoMITM, t.Name) {
		if !hello.hasSNI {
			tlsAlert(pc.Conn, alertAccessDenied)
			return connOutcome{"deny", "no-mitm " + t.Name + ": a ClientHello without SNI is refused"}
		}
		if hello.ech {
			// The outer SNI names only the front: passed through, the
			// encrypted inner hello could reach any site behind it.
			tlsAlert(pc.Conn, alertAccessDenied)
			return connOutcome{"deny", "no-mitm " + t.Name + ": an encrypted ClientHello (ECH) is refused: its real destination is hidden; turn ECH off in the client"}
		}
		pc.Conn.SetReadDeadline(time.Time{})
		return e.splice(ctx, pc, t, NoMITMReason)
	}
	var refused string
	cfg := &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"h2", "http/1.1"},
		// The standard library parses the ClientHello again; check its view
		// too, so a parser difference cannot smuggle another name in.
		GetCertificate: func(hi *tls.ClientHelloInfo) (*tls.Certificate, error) {
			if refused = SNIMismatch(hi.ServerName, hi.ServerName != "", t.Name); refused != "" {
				return nil, errors.New(refused)
			}
			return e.leaves.get(t.Name)
		},
	}
	bc := &batchConn{Conn: pc}
	tc := tls.Server(bc, cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		if refused != "" {
			return connOutcome{"deny", refused}
		}
		// Not a policy matter: e.g. the guest does not trust the vibedom CA.
		return connOutcome{"error", "TLS handshake with the guest failed: " + err.Error()}
	}
	pc.Conn.SetReadDeadline(time.Time{})
	h := &connHandler{e: e, t: t, scheme: "https"}
	if tc.ConnectionState().NegotiatedProtocol == "h2" {
		var wg sync.WaitGroup
		e.h2.ServeConn(tc, &http2.ServeConnOpts{
			Context:    ctx,
			Handler:    trackHandler(&wg, h),
			BaseConfig: &http.Server{ErrorLog: e.stdlog, IdleTimeout: e.cfg.IdleTimeout},
		})
		wg.Wait()
		return connOutcome{"allow", "tls h2"}
	}
	h.guest = bc
	e.serveHTTP1(ctx, tc, h)
	return connOutcome{"allow", "tls http/1.1"}
}

// SNIMismatch says why a ClientHello's server name is not acceptable for
// the admitted name, or "" when it is.
func SNIMismatch(sni string, has bool, name string) string {
	if !has {
		if _, ok := egress.ParseAddr(name); ok {
			return ""
		}
		return fmt.Sprintf("TLS ClientHello without SNI to %s (a name needs SNI)", name)
	}
	var n string
	if ip, ok := egress.ParseAddr(sni); ok {
		n = ip.String()
	} else if nn, err := egress.NormalizeName(sni); err == nil {
		n = nn
	}
	if n == "" || n != name {
		return fmt.Sprintf("TLS SNI %q does not match the admitted name %s", egress.Shorten(sni), name)
	}
	return ""
}

// trackHandler counts running handlers in wg so a connection's owner can
// wait for them (a hijacked or HTTP/2 handler can outlive the serve loop).
func trackHandler(wg *sync.WaitGroup, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		wg.Add(1)
		defer wg.Done()
		h.ServeHTTP(w, r)
	})
}

// serveHTTP1 serves HTTP/1.x on c until the connection ends (including a
// hijacked connection, e.g. a WebSocket, being closed by its handler).
func (e *GoEngine) serveHTTP1(ctx context.Context, c net.Conn, h http.Handler) {
	var wg sync.WaitGroup
	nc := &notifyConn{Conn: c, done: make(chan struct{})}
	srv := &http.Server{
		Handler:           trackHandler(&wg, h),
		ReadHeaderTimeout: 30 * time.Second,
		IdleTimeout:       e.cfg.IdleTimeout,
		MaxHeaderBytes:    1 << 20,
		ErrorLog:          e.stdlog,
		BaseContext:       func(net.Listener) context.Context { return ctx },
	}
	srv.Serve(&oneConnListener{c: nc})
	<-nc.done
	wg.Wait()
}

// notifyConn closes done when it is closed.
type notifyConn struct {
	net.Conn
	once sync.Once
	done chan struct{}
}

func (c *notifyConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { close(c.done) })
	return err
}

func (c *notifyConn) CloseWrite() error {
	return closeWrite(c.Conn)
}

// oneConnListener hands out one connection, then reports closed once that
// connection is.
type oneConnListener struct {
	c    *notifyConn
	used bool
}

var errListenerDone = errors.New("connection served")

func (l *oneConnListener) Accept() (net.Conn, error) {
	if !l.used {
		l.used = true
		return l.c, nil
	}
	<-l.c.done
	return nil, errListenerDone
}

func (l *oneConnListener) Close() error   { return nil }
func (l *oneConnListener) Addr() net.Addr { return l.c.LocalAddr() }

// Splice copies bytes both ways between the guest (pc) and t's upstream,
// through the dial guard, until both directions end, and says what came
// of it: the connect event's decision and reason (mode when it ran).
func (e *GoEngine) Splice(ctx context.Context, pc *PeekConn, t netstack.Target, mode string) (decision, reason string) {
	out := e.splice(ctx, pc, t, mode)
	return out.decision, out.reason
}

func (e *GoEngine) splice(ctx context.Context, pc *PeekConn, t netstack.Target, mode string) connOutcome {
	up, err := e.dial(ctx, "tcp", egress.HostPort(t.Name, t.Port))
	if err != nil {
		return connOutcome{"error", "connect upstream " + egress.HostPort(t.Name, t.Port) + ": " + err.Error()}
	}
	defer up.Close()
	stop := context.AfterFunc(ctx, func() { up.Close() })
	defer stop()
	Relay(pc, up)
	return connOutcome{"allow", mode}
}

// Relay copies bytes both ways between a and b until both directions have
// ended: when one side's reads end, the other side's writing half is
// closed (when it can be); a copy that fails closes both. It returns once
// both copies are done.
func Relay(a, b net.Conn) {
	errc := make(chan error, 2)
	go func() { errc <- copyHalf(b, a) }()
	go func() { errc <- copyHalf(a, b) }()
	if err := <-errc; err != nil {
		a.Close()
		b.Close()
	}
	<-errc
}

// copyHalf copies src to dst, then half-closes dst.
func copyHalf(dst, src net.Conn) error {
	bp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bp)
	_, err := io.CopyBuffer(struct{ io.Writer }{dst}, struct{ io.Reader }{src}, *bp)
	closeWrite(dst)
	return err
}

// closeWrite half-closes c when it can (a TCP connection, or a wrapper
// that passes CloseWrite on).
func closeWrite(c any) error {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// defaultPort is the default port of scheme.
func defaultPort(scheme string) uint16 {
	if scheme == "https" || scheme == "wss" {
		return 443
	}
	return 80
}

// authority is name[:port], the port left out when it is the scheme's
// default.
func authority(name string, port uint16, scheme string) string {
	if port == defaultPort(scheme) {
		if strings.Contains(name, ":") {
			return "[" + name + "]"
		}
		return name
	}
	return egress.HostPort(name, port)
}
