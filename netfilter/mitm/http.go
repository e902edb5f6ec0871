package mitm

import (
	"github.com/vibedom/vibedom/credentials"
	"github.com/vibedom/vibedom/netfilter/egress"
	"github.com/vibedom/vibedom/netfilter/netstack"

	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// connHandler serves the HTTP requests of one transparently intercepted
// connection admitted for t.
type connHandler struct {
	e      *GoEngine
	t      netstack.Target
	scheme string     // "https" or "http"
	guest  *batchConn // the guest's HTTP/1 connection (nil for HTTP/2)
}

func (h *connHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	dest := fwdTarget{name: h.t.Name, port: h.t.Port, scheme: h.scheme, decision: h.t.Decision, src: h.t.Guest}
	if r.Method == http.MethodConnect {
		h.e.refuse(w, r, dest, http.StatusMethodNotAllowed,
			"CONNECT is served only by the explicit proxy, not on an intercepted connection")
		return
	}
	if h.scheme == "http" && h.t.Port == 443 {
		h.e.refuse(w, r, dest, http.StatusForbidden, plainOn443)
		return
	}
	if reason := AuthorityMismatch(r, h.t.Name, h.t.Port, h.scheme); reason != "" {
		// 421 tells a client this connection cannot serve that authority.
		h.e.refuse(w, r, dest, http.StatusMisdirectedRequest, reason)
		return
	}
	h.e.forward(w, r, dest, h.guest)
}

// plainOn443 refuses plain HTTP to port 443 on every path (transparent, a
// CONNECT tunnel, an explicit proxy's http://host:443/ URI): that port is
// HTTPS, and a request there in the clear is what would carry a swapped
// credential unencrypted.
const plainOn443 = "plain HTTP to port 443 is refused: port 443 is HTTPS; use https://"

// AuthorityMismatch says why the request's Host (HTTP/2: :authority) does not
// name the admitted destination, or "" when it does. A Host without a port
// means the scheme's default port.
func AuthorityMismatch(r *http.Request, name string, port uint16, scheme string) string {
	host, p, ok := SplitAuthority(r.Host, defaultPort(scheme))
	if !ok {
		return fmt.Sprintf("Host %q is not a valid host[:port]", egress.Shorten(r.Host))
	}
	if host != name || p != port {
		return fmt.Sprintf("Host %q does not match the admitted destination %s (refused: Host header or SNI spoofing)",
			egress.Shorten(r.Host), egress.HostPort(name, port))
	}
	if r.URL.Host != "" && r.URL.Host != r.Host {
		return fmt.Sprintf("request URI host %q does not match Host %q", egress.Shorten(r.URL.Host), egress.Shorten(r.Host))
	}
	return ""
}

// SplitAuthority parses host[:port] into a normalised name (or IP string)
// and port.
func SplitAuthority(a string, def uint16) (string, uint16, bool) {
	if a == "" {
		return "", 0, false
	}
	host, port := a, def
	if h, ps, err := net.SplitHostPort(a); err == nil {
		n, err := strconv.ParseUint(ps, 10, 16)
		if err != nil || n == 0 {
			return "", 0, false
		}
		host, port = h, uint16(n)
	} else if strings.HasPrefix(a, "[") {
		if !strings.HasSuffix(a, "]") {
			return "", 0, false
		}
	} else if strings.Contains(a, ":") {
		return "", 0, false
	}
	if ip, ok := egress.ParseAddr(host); ok {
		return ip.String(), port, true
	}
	if strings.HasPrefix(host, "[") {
		return "", 0, false
	}
	n, err := egress.NormalizeName(host)
	if err != nil {
		return "", 0, false
	}
	return n, port, true
}

// fwdTarget is where a request goes and why it may.
type fwdTarget struct {
	name     string
	port     uint16
	scheme   string
	decision egress.Decision
	src      netip.AddrPort
}

// reqState collects what one request's Event reports.
type reqState struct {
	status   atomic.Int64
	up, down atomic.Int64
	errText  atomic.Pointer[string]
	// upgrade makes the writer the guest's bytes go through after a 101
	// (an UpgradeFilter's), or is nil.
	upgrade func(io.Writer) io.WriteCloser
	// websocket is true when the request asked for a WebSocket, the only
	// protocol switch the proxy relays.
	websocket bool
	// guest is the guest's connection when its responses can be batched,
	// upstream the connection the request went out on when it can flush
	// them.
	guest    *batchConn
	upstream atomic.Pointer[upstreamConn]
}

type reqStateKey struct{}

func stateOf(ctx context.Context) *reqState {
	st, _ := ctx.Value(reqStateKey{}).(*reqState)
	return st
}

// refuse answers a request the proxy will not forward, and records it.
func (e *GoEngine) refuse(w http.ResponseWriter, r *http.Request, dest fwdTarget, status int, reason string) {
	w.Header().Set("Connection", "close")
	e.refuseKeep(w, r, dest, status, reason)
}

// refuseKeep is refuse without closing the connection: on HTTP/2 a
// "Connection: close" ends every other stream of the connection too.
func (e *GoEngine) refuseKeep(w http.ResponseWriter, r *http.Request, dest fwdTarget, status int, reason string) {
	e.refuseAs(w, r, dest, status, reason, false)
}

// refuseAs answers with the refusal (RefusedHeader, a reason the agent can
// read, as JSON when asked); policy says a rule could allow it.
func (e *GoEngine) refuseAs(w http.ResponseWriter, r *http.Request, dest fwdTarget, status int, reason string, policy bool) {
	writeRefusal(w, r, dest.name, dest.port, status, reason, e.cfg.Session, policy)
	e.events.Record(egress.Event{
		Time:     time.Now(),
		Kind:     "request",
		Name:     dest.name,
		Port:     dest.port,
		Src:      AddrString(dest.src),
		Method:   r.Method,
		URL:      RedactURL(dest.scheme, r.Host, r.URL),
		Decision: "deny",
		Rule:     dest.decision.Rule,
		Reason:   reason,
		Status:   status,
	})
}

// answer sends a filter's own answer to the guest in place of the request
// (nothing is forwarded) and records it.
func (e *GoEngine) answer(w http.ResponseWriter, r *http.Request, dest fwdTarget, a *credentials.Answer) {
	for k, vs := range a.Header {
		w.Header()[k] = vs
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(a.Body)))
	w.Header().Set("X-Vibedom", "answered")
	w.WriteHeader(a.Status)
	w.Write(a.Body)
	e.events.Record(egress.Event{Time: time.Now(), Kind: "request", Name: dest.name, Port: dest.port, Src: AddrString(dest.src),
		Method: r.Method, URL: RedactURL(dest.scheme, r.Host, r.URL), Decision: a.Decision, Rule: dest.decision.Rule,
		Reason: "answered by vibedom, not forwarded: " + a.Reason, Status: a.Status})
}

// forward runs r through the filter and sends it to dest, streaming the
// response back, and records one Event. guest, when not nil, is the
// HTTP/1 connection w writes to; the response body is then batched on it.
func (e *GoEngine) forward(w http.ResponseWriter, r *http.Request, dest fwdTarget, guest *batchConn) {
	start := time.Now()
	st := &reqState{guest: guest}
	ctx := context.WithValue(r.Context(), reqStateKey{}, st)
	if guest != nil {
		// Learn which upstream connection the request goes out on.
		ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
			GotConn: func(info httptrace.GotConnInfo) { st.upstream.Store(asUpstream(info.Conn)) },
		})
	}
	out := r.Clone(ctx)
	out.URL.Scheme = dest.scheme
	out.URL.Host = authority(dest.name, dest.port, dest.scheme)
	out.Host = out.URL.Host
	out.RequestURI = ""

	ev := egress.Event{
		Time:   start,
		Kind:   "request",
		Name:   dest.name,
		Port:   dest.port,
		Src:    AddrString(dest.src),
		Method: r.Method,
		Rule:   dest.decision.Rule,
	}
	release, err := e.budget.Take(RequestCharge, false)
	if err != nil {
		e.overBudget(w, r, dest, err)
		return
	}
	defer release()
	if n := bodyCharge(out, e.cfg.BodyBufferLimit); n > 0 {
		releaseBody, err := e.budget.Take(n, true)
		if err != nil {
			e.overBudget(w, r, dest, err)
			return
		}
		defer releaseBody()
	}
	if out.Body != nil && out.Body != http.NoBody {
		out.Body = &idleBody{ReadCloser: out.Body, rc: http.NewResponseController(w), idle: e.cfg.BodyIdleTimeout}
		if out.Trailer != nil {
			// The server fills r's trailers once the body has ended: they
			// are copied into the map the filter is given (it wraps this
			// body, and scrubs them before the transport sends them).
			out.Body = &trailerCopy{ReadCloser: out.Body, from: r, to: out.Trailer}
		}
	}
	st.websocket = RestrictUpgrade(out)
	// The transports always verify upstream TLS (system roots plus
	// ExtraRoots, never InsecureSkipVerify): https is verified.
	done, err := e.filter.FilterRequest(ctx, Destination{Name: dest.name, Port: dest.port, Scheme: dest.scheme, Verified: dest.scheme == "https"}, out)
	var ans *credentials.Answer
	if errors.As(err, &ans) {
		e.answer(w, r, dest, ans)
		return
	}
	if err != nil {
		e.refuse(w, r, dest, http.StatusForbidden, "request refused by the content filter: "+err.Error())
		return
	}
	if out.Body != nil && out.Body != http.NoBody {
		out.Body = &countBody{ReadCloser: out.Body, n: &st.up}
	}
	if uf, ok := e.filter.(UpgradeFilter); ok && st.websocket {
		st.upgrade = func(w io.Writer) io.WriteCloser { return uf.UpgradeWriter(out, w) }
	}
	defer func() {
		var findings []egress.Finding
		if done != nil {
			findings = done()
		}
		ev.Status = int(st.status.Load())
		ev.BytesUp, ev.BytesDn = st.up.Load(), st.down.Load()
		ev.Findings = findings
		ev.URL = RedactURL(dest.scheme, out.Host, out.URL) // the filter may have rewritten it
		switch {
		case st.errText.Load() != nil:
			ev.Decision, ev.Reason = "error", *st.errText.Load()
		case ScrubDescription(findings) != "":
			ev.Decision, ev.Reason = "scrub", "redacted: "+ScrubDescription(findings)
		case len(findings) > 0:
			ev.Decision, ev.Reason = "allow", fmt.Sprintf("%d finding(s) logged, not redacted", len(findings))
		default:
			ev.Decision = "allow"
		}
		e.events.Record(ev)
	}()
	rp := e.rp1
	if r.ProtoMajor == 2 {
		rp = e.rp2
	}
	if hs, ok := e.filter.(ResponseHeaderScrubber); ok {
		// 1xx header blocks (103 Early Hints) skip ModifyResponse.
		w = &scrubHeaderWriter{ResponseWriter: w, scrub: hs.ScrubResponseHeader}
	}
	if guest != nil {
		defer func() {
			guest.setHold(false)
			if up := st.upstream.Load(); up != nil {
				up.guest.CompareAndSwap(guest, nil)
			}
		}()
	}
	rp.ServeHTTP(w, out)
}

// modifyResponse counts the response body as it streams to the guest and,
// for an HTTP/1 guest, has its TLS records batched (see batchConn).
func (e *GoEngine) modifyResponse(resp *http.Response) error {
	st := stateOf(resp.Request.Context())
	if st == nil {
		return nil
	}
	st.status.Store(int64(resp.StatusCode))
	if resp.StatusCode == http.StatusSwitchingProtocols {
		if !st.websocket || !strings.EqualFold(resp.Header.Get("Upgrade"), "websocket") {
			return fmt.Errorf("%w: upstream switched to %q; only a WebSocket upgrade the proxy asked for is relayed",
				errUpgradeRefused, egress.Shorten(resp.Header.Get("Upgrade")))
		}
		if hs, ok := e.filter.(ResponseHeaderScrubber); ok {
			hs.ScrubResponseHeader(resp.Header)
		}
		if rwc, ok := resp.Body.(io.ReadWriteCloser); ok {
			// Read from the upstream: down to the guest.
			var up io.ReadWriteCloser = countRW{rw: rwc, read: &st.down, written: &st.up}
			if st.upgrade != nil {
				if w := st.upgrade(up); w != nil {
					up = &wsConn{ReadWriteCloser: up, w: w}
				}
			}
			if uf, ok := e.filter.(UpstreamFrameFilter); ok {
				up = &wsReadConn{ReadWriteCloser: up, r: uf.UpstreamFrames(up)}
			}
			resp.Body = up
		}
		return nil
	}
	if rf, ok := e.filter.(ResponseFilter); ok {
		rf.FilterResponse(resp)
	}
	if resp.Body != nil {
		resp.Body = &countBody{ReadCloser: resp.Body, n: &st.down}
	}
	// Batch the body's records to the guest while more of it is at hand;
	// the upstream connection has the batch written out when it waits.
	if up := st.upstream.Load(); up != nil && st.guest != nil {
		up.guest.Store(st.guest)
		st.guest.setHold(true)
	}
	return nil
}

// overBudget answers 503 to a request the memory budget cannot cover.
func (e *GoEngine) overBudget(w http.ResponseWriter, r *http.Request, dest fwdTarget, err error) {
	w.Header().Set("Retry-After", "1")
	if r.ProtoMajor < 2 {
		// The body is left unread: the HTTP/1 connection cannot go on.
		w.Header().Set("Connection", "close")
	}
	e.refuseKeep(w, r, dest, http.StatusServiceUnavailable, err.Error())
}

// errUpgradeRefused is an upstream's 101 to anything but a WebSocket.
var errUpgradeRefused = errors.New("protocol switch refused")

// RestrictUpgrade strips every protocol upgrade from r but a WebSocket
// (h2c, TLS, connect-udp, anything a cooperating upstream could turn into
// an unscrubbed tunnel) and reports whether r asks for a WebSocket, whose
// Upgrade header it then leaves as exactly "websocket". Without Upgrade the
// request goes on as an ordinary one.
func RestrictUpgrade(r *http.Request) bool {
	ups := r.Header.Values("Upgrade")
	ws := len(ups) > 0 && IsWebSocketUpgrade(r) && r.Method == http.MethodGet
	for _, v := range ups {
		for _, tok := range strings.Split(v, ",") {
			if !strings.EqualFold(strings.TrimSpace(tok), "websocket") {
				ws = false
			}
		}
	}
	r.Header.Del("HTTP2-Settings")
	if ws {
		r.Header.Set("Upgrade", "websocket")
		return true
	}
	r.Header.Del("Upgrade")
	return false
}

// upstreamError answers 502 with a plain-text body that names the reason.
func (e *GoEngine) upstreamError(w http.ResponseWriter, r *http.Request, err error) {
	reason := DescribeUpstreamError(r.URL.Host, err)
	if st := stateOf(r.Context()); st != nil {
		st.status.Store(http.StatusBadGateway)
		st.errText.Store(&reason)
	}
	if errors.Is(err, context.Canceled) {
		// The guest went away; nobody is listening for an answer.
		return
	}
	e.log.Debug("upstream request failed", "host", r.URL.Host, "reason", reason)
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Vibedom", "upstream-error")
	w.WriteHeader(http.StatusBadGateway)
	fmt.Fprintf(w, "vibedom: bad gateway: %s\n", reason)
}

// DescribeUpstreamError turns a transport error into one line a user (or an
// agent) can act on.
func DescribeUpstreamError(host string, err error) string {
	var (
		verr     *tls.CertificateVerificationError
		unknown  x509.UnknownAuthorityError
		hostErr  x509.HostnameError
		invalid  x509.CertificateInvalidError
		recErr   tls.RecordHeaderError
		dnsErr   *net.DNSError
		alertErr tls.AlertError
	)
	switch {
	case errors.As(err, &unknown):
		return fmt.Sprintf("upstream TLS certificate of %s is not trusted: signed by an unknown authority (%s)", host, unknown.Error())
	case errors.As(err, &hostErr):
		return fmt.Sprintf("upstream TLS certificate is not valid for %s: %s", host, hostErr.Error())
	case errors.As(err, &invalid):
		return fmt.Sprintf("upstream TLS certificate of %s is invalid: %s", host, invalid.Error())
	case errors.As(err, &verr):
		return fmt.Sprintf("upstream TLS certificate of %s failed verification: %v", host, verr.Err)
	case errors.As(err, &recErr):
		return fmt.Sprintf("upstream %s did not answer with TLS", host)
	case errors.As(err, &alertErr):
		return fmt.Sprintf("upstream %s refused the TLS handshake: %v", host, alertErr)
	case errors.Is(err, errUpgradeRefused):
		return err.Error()
	case errors.Is(err, egress.ErrUpstreamAddress):
		return fmt.Sprintf("%s: %v", host, err)
	case errors.As(err, &dnsErr):
		return fmt.Sprintf("could not resolve %s: %v", host, dnsErr.Err)
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Sprintf("upstream %s timed out", host)
	}
	var opErr *net.OpError
	if errors.As(err, &opErr) && opErr.Op == "dial" {
		return fmt.Sprintf("could not connect to %s: %v", host, opErr.Err)
	}
	return fmt.Sprintf("request to %s failed: %v", host, err)
}

// RedactURL renders scheme://host/path?query with every query value (and
// any parameter without "=") replaced by REDACTED and no user info. Long
// URLs are cut at 2048 bytes.
func RedactURL(scheme, host string, u *url.URL) string {
	var b strings.Builder
	b.WriteString(scheme)
	b.WriteString("://")
	b.WriteString(host)
	if u != nil {
		p := u.EscapedPath()
		if p == "" {
			p = "/"
		}
		if u.Opaque != "" {
			p = u.Opaque
		}
		b.WriteString(p)
		if u.RawQuery != "" || u.ForceQuery {
			b.WriteByte('?')
			b.WriteString(redactQuery(u.RawQuery))
		}
	}
	s := b.String()
	if len(s) > 2048 {
		s = s[:2048] + "…"
	}
	return s
}

func redactQuery(q string) string {
	if q == "" {
		return ""
	}
	parts := strings.Split(q, "&")
	for i, p := range parts {
		k, v, ok := strings.Cut(p, "=")
		switch {
		case !ok && p == "":
		case !ok:
			parts[i] = "REDACTED"
		case len(k) > 64:
			parts[i] = k[:64] + "…=REDACTED"
		case v == "":
			parts[i] = k + "="
		default:
			parts[i] = k + "=REDACTED"
		}
	}
	return strings.Join(parts, "&")
}

// countBody counts bytes read through it.
type countBody struct {
	io.ReadCloser
	n *atomic.Int64
}

func (b *countBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n.Add(int64(n))
	return n, err
}

// AddrString is a as an event's Src or Dst: "" when a is not valid.
func AddrString(a netip.AddrPort) string {
	if !a.IsValid() {
		return ""
	}
	return a.String()
}

// trailerCopy copies the guest's request trailers into the outgoing
// request's trailer map (to, as the filter was given it) when the body
// ends, before the end is passed on.
type trailerCopy struct {
	io.ReadCloser
	from *http.Request
	to   http.Header
	done bool
}

func (b *trailerCopy) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF && !b.done {
		b.done = true
		for k, v := range b.from.Trailer {
			b.to[k] = slices.Clone(v)
		}
	}
	return n, err
}
