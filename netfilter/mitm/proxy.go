package mitm

import (
	"github.com/vibedom/vibedom/netfilter/egress"
	"github.com/vibedom/vibedom/netfilter/netstack"

	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"time"
)

// HandleProxyConn implements Engine: it serves the explicit HTTP proxy (for
// tools that honour HTTPS_PROXY / HTTP_PROXY) on conn and closes it.
//
//   - CONNECT host:port: the target is decided by the policy; a denied one
//     gets 403 with the reason. An allowed one gets 200, and the tunnel is
//     then handled exactly like a transparent connection admitted for that
//     target (HandleConn): the inner SNI and Host must agree with it.
//   - GET http://host/path (absolute URI; https:// too): decided by the
//     policy per request, then forwarded like an intercepted request.
//   - Anything else gets 400.
//
// Each CONNECT is recorded as a "proxy" Event, each forwarded or refused
// request as a "request" Event.
func (e *GoEngine) HandleProxyConn(ctx context.Context, conn net.Conn, src netip.AddrPort) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	// The HTTP server's ReadHeaderTimeout bounds a silent client.
	e.serveHTTP1(ctx, conn, &proxyHandler{e: e, src: src, conn: conn})
	conn.Close()
}

type proxyHandler struct {
	e   *GoEngine
	src netip.AddrPort
	// conn is the guest's connection to the proxy: tracked (Track) while
	// an absolute-URI request to a name is served on it, so that a live
	// deny of the name closes a long response or a WebSocket too.
	conn net.Conn
}

// decide asks the policy about name:port; an IP literal the dial guard
// would refuse is refused here already, whatever a rule says, so the guest
// learns it from the CONNECT's answer (the guard refuses it again at the
// dial).
func (h *proxyHandler) decide(name string, port uint16) egress.Decision {
	if h.e.cfg.Policy == nil {
		return egress.Decision{Reason: "the explicit proxy has no policy"}
	}
	d := h.e.cfg.Policy.Decide(name, port)
	if ip, ok := egress.ParseAddr(name); ok && d.Allow {
		if _, err := h.e.guard.Check(ip); err != nil {
			return egress.Decision{Rule: d.Rule, Source: sourceGuard, Reason: err.Error()}
		}
	}
	return d
}

// allowable reports whether a rule could allow what d refused: not when
// the dial guard refused it, nor for an IP literal the guard never dials.
func (h *proxyHandler) allowable(name string, d egress.Decision) bool {
	if d.Source == sourceGuard {
		return false
	}
	if ip, ok := egress.ParseAddr(name); ok {
		if _, err := h.e.guard.Check(ip); err != nil {
			return false
		}
	}
	return true
}

func (h *proxyHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodConnect {
		h.connect(w, r)
		return
	}
	if !r.URL.IsAbs() || r.URL.Host == "" || (r.URL.Scheme != "http" && r.URL.Scheme != "https") {
		h.e.refuse(w, r, fwdTarget{scheme: "http", src: h.src}, http.StatusBadRequest,
			"this is vibedom's egress proxy: send CONNECT host:port or an absolute URI (GET http://host/path)")
		return
	}
	name, port, ok := SplitAuthority(r.URL.Host, defaultPort(r.URL.Scheme))
	if !ok {
		h.e.refuse(w, r, fwdTarget{scheme: r.URL.Scheme, src: h.src}, http.StatusBadRequest,
			fmt.Sprintf("%q is not a valid host[:port]", egress.Shorten(r.URL.Host)))
		return
	}
	d := h.decide(name, port)
	dest := fwdTarget{name: name, port: port, scheme: r.URL.Scheme, decision: d, src: h.src}
	if !d.Allow {
		w.Header().Set("Connection", "close")
		h.e.refuseAs(w, r, dest, http.StatusForbidden, denialText(name, port, d), h.allowable(name, d))
		return
	}
	if r.URL.Scheme == "http" && port == 443 {
		h.e.refuse(w, r, dest, http.StatusForbidden, plainOn443)
		return
	}
	if h.e.cfg.Track != nil && h.conn != nil {
		done := h.e.cfg.Track(netstack.Target{Name: name, Port: port, Decision: d, Guest: h.src}, h.conn)
		defer done()
	}
	h.e.forward(w, r, dest, nil)
}

func (h *proxyHandler) connect(w http.ResponseWriter, r *http.Request) {
	ev := egress.Event{Time: time.Now(), Kind: "proxy", Method: http.MethodConnect, Src: AddrString(h.src)}
	fail := func(status int, reason string, d egress.Decision) {
		ev.Decision, ev.Reason, ev.Status, ev.Rule = "deny", reason, status, d.Rule
		h.e.events.Record(ev)
		w.Header().Set("Connection", "close")
		name := ""
		if status != http.StatusBadRequest {
			name = ev.Name
		}
		writeRefusal(w, r, name, ev.Port, status, reason, h.e.cfg.Session, status == http.StatusForbidden && h.allowable(name, d))
	}
	host, ps, err := net.SplitHostPort(r.Host)
	pn, perr := strconv.ParseUint(ps, 10, 16)
	if err != nil || perr != nil || pn == 0 {
		ev.Name = egress.Shorten(r.Host)
		fail(http.StatusBadRequest, fmt.Sprintf("CONNECT target %q is not host:port", egress.Shorten(r.Host)), egress.Decision{})
		return
	}
	port := uint16(pn)
	name, _, ok := SplitAuthority(net.JoinHostPort(host, ps), port)
	ev.Name, ev.Port = name, port
	if !ok {
		ev.Name = egress.Shorten(host)
		fail(http.StatusBadRequest, fmt.Sprintf("CONNECT target %q is not a valid host name or IP address", egress.Shorten(host)), egress.Decision{})
		return
	}
	d := h.decide(name, port)
	if !d.Allow {
		fail(http.StatusForbidden, denialText(name, port, d), d)
		return
	}
	c, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		fail(http.StatusInternalServerError, "cannot take over the connection: "+err.Error(), d)
		return
	}
	ev.Decision, ev.Rule, ev.Status = "allow", d.Rule, http.StatusOK
	h.e.events.Record(ev)
	if _, err := c.Write([]byte("HTTP/1.1 200 Connection established\r\n\r\n")); err != nil {
		c.Close()
		return
	}
	pc := NewPeekConn(c, brw.Reader)
	c.SetDeadline(time.Time{})
	// The request's context lives until this handler returns, which is
	// when the tunnel ends.
	t := netstack.Target{Name: name, Port: port, Decision: d, Guest: h.src}
	if h.e.cfg.Track != nil {
		done := h.e.cfg.Track(t, pc)
		defer done()
	}
	if h.e.cfg.Tunnel != nil {
		h.e.cfg.Tunnel(r.Context(), pc, t)
		return
	}
	h.e.HandleConn(r.Context(), pc, t)
}

// sourceGuard marks a refusal by the dial guard, which no rule overrides.
const sourceGuard = "the dial guard"

// denialText is the body of a 403 from the explicit proxy.
func denialText(name string, port uint16, d egress.Decision) string {
	if d.Source == sourceGuard {
		return fmt.Sprintf("%s is never reachable, whatever the rules say: %s", egress.HostPort(name, port), d.Reason)
	}
	s := fmt.Sprintf("%s is not allowed by the egress policy: %s", egress.HostPort(name, port), d.Reason)
	if d.Rule != "" {
		return s + fmt.Sprintf(" (rule %q from %s; a deny rule beats any allow rule)", d.Rule, d.Source)
	}
	return s
}
