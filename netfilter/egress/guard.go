package egress

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// ErrUpstreamAddress is wrapped by every refusal of the engine's dial guard:
// the address an upstream name or IP literal leads to is one vibedom never
// connects to (loopback, unspecified, link-local, multicast, broadcast, the
// host's own addresses), or a private one (RFC 1918, ULA, CGNAT) no
// allow-private rule covers.
var ErrUpstreamAddress = errors.New("upstream address refused")

// LookupFunc resolves a normalised host name to its addresses, like
// net.Resolver.LookupNetIP(ctx, "ip", name).
type LookupFunc func(ctx context.Context, name string) ([]netip.Addr, error)

// AddrClass is what the dial guard makes of an address.
type AddrClass int

const (
	addrPublic  AddrClass = iota
	AddrPrivate           // RFC 1918, ULA, CGNAT, site-local, local-use NAT64: needs an allow-private rule
	addrHost              // one of the host's own interface addresses: never
	addrNever             // loopback, unspecified, link-local, multicast, broadcast, reserved: never
)

var (
	neverV4 = []netip.Prefix{
		netip.MustParsePrefix("0.0.0.0/8"),
		netip.MustParsePrefix("127.0.0.0/8"),
		netip.MustParsePrefix("169.254.0.0/16"), // link-local, cloud metadata (169.254.169.254)
		netip.MustParsePrefix("224.0.0.0/4"),    // multicast
		netip.MustParsePrefix("240.0.0.0/4"),    // reserved, 255.255.255.255
	}
	neverV6 = []netip.Prefix{
		netip.MustParsePrefix("::/128"),
		netip.MustParsePrefix("::1/128"),
		netip.MustParsePrefix("fe80::/10"), // link-local (also fd00:ec2::254 is ULA, below)
		netip.MustParsePrefix("ff00::/8"),  // multicast
		netip.MustParsePrefix("100::/64"),  // discard-only
	}
	privateRanges = []netip.Prefix{
		netip.MustParsePrefix("10.0.0.0/8"),
		netip.MustParsePrefix("172.16.0.0/12"),
		netip.MustParsePrefix("192.168.0.0/16"),
		netip.MustParsePrefix("100.64.0.0/10"),  // CGNAT
		netip.MustParsePrefix("fc00::/7"),       // ULA
		netip.MustParsePrefix("fec0::/10"),      // site-local (deprecated)
		netip.MustParsePrefix("64:ff9b:1::/48"), // local-use NAT64
	}
	nat64     = netip.MustParsePrefix("64:ff9b::/96")
	sixToFour = netip.MustParsePrefix("2002::/16")
	teredo    = netip.MustParsePrefix("2001::/32")
)

// embeddedV4 returns the IPv4 addresses an IPv6 address carries in a form
// a host or a relay may turn back into IPv4: IPv4-mapped and -compatible,
// NAT64 (64:ff9b::/96), 6to4 (2002::/16) and Teredo (server and client).
func embeddedV4(a netip.Addr) []netip.Addr {
	if !a.Is6() {
		return nil
	}
	b := a.As16()
	v4 := func(p []byte) netip.Addr { return netip.AddrFrom4([4]byte(p)) }
	switch {
	case a.Is4In6(), nat64.Contains(a):
		return []netip.Addr{v4(b[12:16])}
	case [12]byte(b[:12]) == [12]byte{}:
		return []netip.Addr{v4(b[12:16])} // IPv4-compatible (::/96; :: and ::1 are caught before)
	case sixToFour.Contains(a):
		return []netip.Addr{v4(b[2:6])}
	case teredo.Contains(a):
		client := [4]byte{^b[12], ^b[13], ^b[14], ^b[15]}
		return []netip.Addr{v4(b[4:8]), netip.AddrFrom4(client)}
	}
	return nil
}

// ClassifyAddr says what kind of address a is, looking through the IPv6
// forms that embed an IPv4 address; the most restrictive class wins.
func ClassifyAddr(a netip.Addr, host func(netip.Addr) bool) AddrClass {
	a = a.WithZone("")
	if a.Is4In6() {
		a = a.Unmap()
	}
	class := addrPublic
	list := neverV4
	if a.Is6() {
		list = neverV6
	}
	for _, p := range list {
		if p.Contains(a) {
			return addrNever
		}
	}
	if host != nil && host(a) {
		return addrHost
	}
	for _, p := range privateRanges {
		if p.Contains(a) {
			class = AddrPrivate
		}
	}
	for _, e := range embeddedV4(a) {
		class = max(class, ClassifyAddr(e, host))
	}
	return class
}

// NeverReachable reports whether no rule can make a reachable: the
// addresses the transparent path drops before the policy is asked.
func NeverReachable(a netip.Addr) bool {
	return ClassifyAddr(a, nil) == addrNever
}

// String names the class in messages.
func (c AddrClass) String() string {
	switch c {
	case AddrPrivate:
		return "a private address (RFC 1918, ULA or CGNAT)"
	case addrHost:
		return "one of the host's own addresses"
	case addrNever:
		return "loopback, unspecified, link-local (cloud metadata), multicast or reserved"
	}
	return "public"
}

// DialGuard is the single place every upstream connection of the engine is
// opened: the MITM's transports (HTTP/1, HTTP/2, WebSocket), the splice
// path and the explicit proxy all dial through it. It resolves a name
// itself and decides on each address actually dialled, so a name that
// resolves to loopback is caught like the literal; the default dialer's
// Control function decides again on the socket's address.
type DialGuard struct {
	lookup  LookupFunc
	raw     DialFunc // nil: the guard's own net.Dialer
	private []netip.Prefix
	events  EventSink
	log     *slog.Logger
	hostFn  func() ([]netip.Addr, error)
	dialer  net.Dialer
	Slots   *ConnSlots // nil: unbounded

	mu       sync.Mutex
	pins     map[string]netip.AddrPort // "name:port" → address (--resolve)
	hostAt   time.Time
	hostList []netip.Addr
}

// hostAddrTTL is how long the host's interface addresses are cached.
const hostAddrTTL = 5 * time.Second

type pinnedKey struct{}

// GuardConfig is what the dial guard needs from an engine's configuration;
// the fields mean what mitm.EngineConfig's fields of the same names mean.
type GuardConfig struct {
	Dial         DialFunc
	LookupIP     LookupFunc
	Resolve      []Resolve
	AllowPrivate []netip.Prefix
	HostAddrs    func() ([]netip.Addr, error)
}

// NewDialGuard makes the dial guard of one engine: events get its
// refusals, log its diagnostics.
func NewDialGuard(cfg GuardConfig, events EventSink, log *slog.Logger) *DialGuard {
	g := &DialGuard{lookup: cfg.LookupIP, raw: cfg.Dial, private: cfg.AllowPrivate, events: events, log: log,
		hostFn: cfg.HostAddrs, pins: map[string]netip.AddrPort{}}
	if g.lookup == nil {
		g.lookup = func(ctx context.Context, name string) ([]netip.Addr, error) {
			return net.DefaultResolver.LookupNetIP(ctx, "ip", name)
		}
	}
	if g.hostFn == nil {
		g.hostFn = InterfaceAddrs
	}
	g.dialer = net.Dialer{Timeout: 15 * time.Second, KeepAlive: 30 * time.Second, ControlContext: g.control}
	for _, r := range cfg.Resolve {
		g.Pin(r.Name, r.Port, r.Addr)
	}
	return g
}

// Pin maps name:port to addr, which is then dialled for that name and port
// whatever it is (the user named it with --resolve).
func (g *DialGuard) Pin(name string, port uint16, addr netip.AddrPort) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.pins[HostPort(name, port)] = addr
}

// InterfaceAddrs lists the host's own interface addresses, never dialled.
func InterfaceAddrs() ([]netip.Addr, error) {
	as, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	out := make([]netip.Addr, 0, len(as))
	for _, a := range as {
		if p, err := netip.ParsePrefix(a.String()); err == nil {
			out = append(out, p.Addr().Unmap().WithZone(""))
		}
	}
	return out, nil
}

// isHost reports whether a is one of the host's own addresses (cached for
// hostAddrTTL; an error reading them keeps the last list).
func (g *DialGuard) isHost(a netip.Addr) bool {
	g.mu.Lock()
	if time.Since(g.hostAt) > hostAddrTTL {
		if l, err := g.hostFn(); err == nil {
			g.hostList = l
		} else {
			g.log.Warn("cannot list the host's addresses; using the last list", "err", err)
		}
		g.hostAt = time.Now()
	}
	l := g.hostList
	g.mu.Unlock()
	for _, h := range l {
		if h.Unmap() == a {
			return true
		}
	}
	return false
}

// Check returns nil when a may be dialled, or an error wrapping
// ErrUpstreamAddress that says why not and what to do.
func (g *DialGuard) Check(a netip.Addr) (AddrClass, error) {
	a = a.Unmap().WithZone("")
	c := ClassifyAddr(a, g.isHost)
	switch c {
	case addrPublic:
		return c, nil
	case AddrPrivate:
		for _, p := range g.private {
			if p.Contains(a) {
				return c, nil
			}
		}
		return c, fmt.Errorf("%w: %s is %s; if the user means it, they add `allow-private %s/%d` to ~/.vibedom/trusted_domains.txt",
			ErrUpstreamAddress, a, c, a, a.BitLen())
	}
	return c, fmt.Errorf("%w: %s is %s, which vibedom never connects to", ErrUpstreamAddress, a, c)
}

// control is the default dialer's last word on the socket's address.
func (g *DialGuard) control(ctx context.Context, _, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("%w: cannot parse %q", ErrUpstreamAddress, address)
	}
	if pinned, ok := ctx.Value(pinnedKey{}).(netip.AddrPort); ok && pinned == ap {
		return nil
	}
	_, err = g.Check(ap.Addr())
	return err
}

// DialContext dials addr ("name:port" or "[ip]:port") if the guard allows
// the address it leads to. A pinned name and port dial their pinned
// address; a name is resolved and only its allowed addresses are tried.
func (g *DialGuard) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	host, ps, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	pn, err := strconv.ParseUint(ps, 10, 16)
	if err != nil {
		return nil, fmt.Errorf("dial %q: bad port", addr)
	}
	port := uint16(pn)
	name := host
	if ip, ok := ParseAddr(host); ok {
		name = ip.String()
	} else if n, err := NormalizeName(host); err == nil {
		name = n
	} else {
		return nil, fmt.Errorf("dial %q: %w", addr, err)
	}
	g.mu.Lock()
	pinned, isPinned := g.pins[HostPort(name, port)]
	g.mu.Unlock()
	if isPinned {
		g.log.Debug("dialling a --resolve address", "name", name, "port", port, "addr", pinned.String())
		return g.dialIP(context.WithValue(ctx, pinnedKey{}, pinned), network, pinned)
	}
	var addrs []netip.Addr
	if ip, ok := ParseAddr(name); ok {
		addrs = []netip.Addr{ip}
	} else {
		addrs, err = g.lookup(ctx, name)
		if err != nil {
			return nil, &net.OpError{Op: "dial", Net: network, Err: err}
		}
		if len(addrs) == 0 {
			return nil, &net.OpError{Op: "dial", Net: network, Err: &net.DNSError{Err: "no addresses", Name: name, IsNotFound: true}}
		}
	}
	var firstRefusal error
	var allowed []netip.AddrPort
	for _, a := range addrs {
		class, err := g.Check(a)
		if err != nil {
			if firstRefusal == nil {
				firstRefusal = err
			}
			g.refused(name, port, a, class, err)
			continue
		}
		allowed = append(allowed, netip.AddrPortFrom(a.Unmap(), port))
	}
	if len(allowed) == 0 {
		return nil, firstRefusal
	}
	return g.dialAddrs(ctx, network, allowed)
}

// fallbackDelay is how long the first address family is tried alone
// before the other one joins (RFC 8305, as net.Dialer does).
const fallbackDelay = 300 * time.Millisecond

// dialAddrs dials the addresses of the first one's family in turn and,
// after fallbackDelay or its failure, those of the other family beside
// them; the first connection wins.
func (g *DialGuard) dialAddrs(ctx context.Context, network string, addrs []netip.AddrPort) (net.Conn, error) {
	var primary, fallback []netip.AddrPort
	for _, a := range addrs {
		if a.Addr().Is4() == addrs[0].Addr().Is4() {
			primary = append(primary, a)
		} else {
			fallback = append(fallback, a)
		}
	}
	if len(fallback) == 0 {
		return g.dialSerial(ctx, network, primary)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		c   net.Conn
		err error
	}
	results := make(chan result, 2)
	launch := func(list []netip.AddrPort) {
		go func() {
			c, err := g.dialSerial(ctx, network, list)
			results <- result{c, err}
		}()
	}
	launch(primary)
	pending, fallbackStarted := 1, false
	timer := time.NewTimer(fallbackDelay)
	defer timer.Stop()
	var firstErr error
	for pending > 0 {
		select {
		case <-timer.C:
			if !fallbackStarted {
				launch(fallback)
				pending, fallbackStarted = pending+1, true
			}
		case r := <-results:
			pending--
			if r.err == nil {
				go func(n int) { // a late second winner is closed
					for ; n > 0; n-- {
						if late := <-results; late.c != nil {
							late.c.Close()
						}
					}
				}(pending)
				return r.c, nil
			}
			if firstErr == nil {
				firstErr = r.err
			}
			if !fallbackStarted {
				launch(fallback)
				pending, fallbackStarted = pending+1, true
			}
		}
	}
	return nil, firstErr
}

// dialSerial tries addrs in turn until one connects.
func (g *DialGuard) dialSerial(ctx context.Context, network string, addrs []netip.AddrPort) (net.Conn, error) {
	var lastErr error
	for _, a := range addrs {
		c, err := g.dialIP(ctx, network, a)
		if err == nil {
			return c, nil
		}
		lastErr = err
		if ctx.Err() != nil {
			break
		}
	}
	return nil, lastErr
}

// dialIP opens the connection, holding one of the session's upstream
// connection slots until it is closed.
func (g *DialGuard) dialIP(ctx context.Context, network string, ap netip.AddrPort) (net.Conn, error) {
	if g.Slots != nil {
		if err := g.Slots.acquire(ctx); err != nil {
			return nil, err
		}
	}
	var c net.Conn
	var err error
	if g.raw != nil {
		c, err = g.raw(ctx, network, ap.String())
	} else {
		c, err = g.dialer.DialContext(ctx, network, ap.String())
	}
	if g.Slots == nil {
		return c, err
	}
	if err != nil {
		g.Slots.release()
		return nil, err
	}
	return &slotConn{Conn: c, slots: g.Slots}, nil
}

// refused records a refused address: a deny (an alert) when the guest
// named it or when it is the host's own or a private address, an error
// when a name merely resolved to loopback or the like.
func (g *DialGuard) refused(name string, port uint16, a netip.Addr, class AddrClass, err error) {
	// Every refusal is an alert, a name that resolves to loopback or the
	// metadata address included: that is how a request to the host's own
	// services looks (red team: such refusals had been logged as errors,
	// out of the user's sight).
	g.events.Record(Event{Time: time.Now(), Kind: "connect", Name: name, Port: port,
		Dst: netip.AddrPortFrom(a, port).String(), Decision: "deny", Reason: err.Error()})
	g.log.Debug("refused an upstream address", "name", name, "port", port, "addr", a.String(), "class", class.String())
}

// DialFunc opens an upstream connection, like net.Dialer.DialContext. addr
// is "name:port" (or "[ip]:port").
type DialFunc func(ctx context.Context, network, addr string) (net.Conn, error)
