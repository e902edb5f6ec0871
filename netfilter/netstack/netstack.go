package netstack

import (
	"github.com/vibedom/vibedom/netfilter/egress"

	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/link/qdisc/fifo"
	"gvisor.dev/gvisor/pkg/tcpip/network/arp"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"
	"gvisor.dev/gvisor/pkg/waiter"
)

// Defaults of StackConfig. The guest network is a /24 in a corner of
// 10.0.0.0/8 that home and office networks rarely use (it is never routed
// anywhere, so a clash would only confuse people reading logs); the
// synthetic addresses the DNS server hands out come from 198.18.0.0/15,
// the RFC 2544 benchmarking range, which no real service uses.
var (
	DefaultSubnet         = netip.MustParsePrefix("10.254.254.0/24")
	DefaultSyntheticRange = netip.MustParsePrefix("198.18.0.0/15")
)

// More StackConfig defaults.
const (
	// DefaultGatewayMAC is the gateway's hardware address, locally
	// administered ("vd").
	DefaultGatewayMAC = "02:76:64:00:00:01"
	// DefaultMTU is the guest NIC's MTU.
	DefaultMTU = 1500
	// DefaultProxyPort is the explicit HTTP proxy's port on the gateway
	// (the conventional Squid port), for HTTP_PROXY/HTTPS_PROXY.
	DefaultProxyPort = 3128
	// DefaultMaxInFlight bounds TCP handshakes in progress.
	DefaultMaxInFlight = 512
	// DefaultHandshakeTimeout bounds a guest's TCP handshake: the SYN-ACK
	// is sent again after 1 s and 3 s, and a guest on a virtual link that
	// answers none of them in 5 s is not completing it.
	DefaultHandshakeTimeout = 5 * time.Second
	// DefaultMaxConns bounds connections handed to the Engine at once.
	DefaultMaxConns = 1024
	// DefaultLease is the DHCP lease time.
	DefaultLease = 12 * time.Hour
)

// ErrServed is returned by Serve when the Stack is already serving or has
// been closed: a Stack serves one link once.
var ErrServed = errors.New("network stack already served or closed")

var _ egress.StackPolicy = (*egress.Policy)(nil)

// StackConfig describes the guest's virtual network. The zero value is
// valid: every field has a default.
type StackConfig struct {
	// Subnet is the guest's IPv4 network (DefaultSubnet).
	Subnet netip.Prefix
	// Gateway is the host stack's address in Subnet: router, DNS server,
	// DHCP server and explicit proxy (the first address of Subnet).
	Gateway netip.Addr
	// Guest is the one address DHCP leases (the address after Gateway).
	Guest netip.Addr
	// GatewayMAC is the gateway's hardware address (DefaultGatewayMAC).
	GatewayMAC net.HardwareAddr
	// GuestMAC, when set, is the only source hardware address nsAccepted
	// and the only client DHCP answers. Empty accepts any unicast source
	// address but the gateway's own.
	GuestMAC net.HardwareAddr
	// MTU is the link's MTU (DefaultMTU); the guest learns it by DHCP
	// when it is not 1500.
	MTU int
	// SyntheticRange is where the DNS server's answers come from
	// (DefaultSyntheticRange). It must not overlap Subnet.
	SyntheticRange netip.Prefix
	// Resolver, when set, is asked whether each allowed name exists
	// upstream (SystemResolver asks the host's resolver); a name that
	// does not gets NXDOMAIN. Nil answers every allowed name.
	Resolver Resolver
	// ProxyPort is the explicit proxy's port on the gateway
	// (DefaultProxyPort).
	ProxyPort uint16
	// MaxInFlight bounds TCP handshakes in progress; further SYNs are
	// ignored until some finish (DefaultMaxInFlight).
	MaxInFlight int
	// HandshakeTimeout is how long a guest's TCP handshake may hold its
	// MaxInFlight slot before it is aborted (DefaultHandshakeTimeout).
	HandshakeTimeout time.Duration
	// MaxConns bounds the connections handed to the Engine at once;
	// further ones are refused (DefaultMaxConns).
	MaxConns int
	// Lease is the DHCP lease time (DefaultLease).
	Lease time.Duration
}

func (c StackConfig) withDefaults() (StackConfig, error) {
	bad := func(format string, a ...any) (StackConfig, error) {
		return c, fmt.Errorf("network stack config: "+format, a...)
	}
	if !c.Subnet.IsValid() {
		c.Subnet = DefaultSubnet
	}
	c.Subnet = c.Subnet.Masked()
	if !c.Subnet.Addr().Is4() || c.Subnet.Bits() < 8 || c.Subnet.Bits() > 30 {
		return bad("subnet %s: want an IPv4 prefix between /8 and /30", c.Subnet)
	}
	if !c.Gateway.IsValid() {
		c.Gateway = c.Subnet.Addr().Next()
	}
	if !c.Guest.IsValid() {
		c.Guest = c.Gateway.Next()
	}
	bcast := addAddr(c.Subnet.Addr(), uint32(1)<<(32-c.Subnet.Bits())-1)
	for _, a := range []struct {
		what string
		a    netip.Addr
	}{{"gateway", c.Gateway}, {"guest", c.Guest}} {
		if !a.a.Is4() || !c.Subnet.Contains(a.a) || a.a == c.Subnet.Addr() || a.a == bcast {
			return bad("%s address %s is not a host address in %s", a.what, a.a, c.Subnet)
		}
	}
	if c.Gateway == c.Guest {
		return bad("gateway and guest share the address %s", c.Gateway)
	}
	if c.GatewayMAC == nil {
		c.GatewayMAC, _ = net.ParseMAC(DefaultGatewayMAC)
	}
	for _, m := range []struct {
		what string
		mac  net.HardwareAddr
	}{{"gateway", c.GatewayMAC}, {"guest", c.GuestMAC}} {
		if m.mac != nil && (len(m.mac) != 6 || m.mac[0]&1 != 0) {
			return bad("%s MAC %s: want a unicast Ethernet address", m.what, m.mac)
		}
	}
	if c.MTU == 0 {
		c.MTU = DefaultMTU
	}
	if c.MTU < 576 || c.MTU > 65535-ethHeaderLen {
		return bad("MTU %d out of range 576-%d", c.MTU, 65535-ethHeaderLen)
	}
	if !c.SyntheticRange.IsValid() {
		c.SyntheticRange = DefaultSyntheticRange
	}
	if c.SyntheticRange.Overlaps(c.Subnet) {
		return bad("synthetic range %s overlaps the subnet %s", c.SyntheticRange, c.Subnet)
	}
	if c.ProxyPort == 0 {
		c.ProxyPort = DefaultProxyPort
	}
	if c.ProxyPort == 53 {
		return bad("proxy port 53 is the DNS server's")
	}
	if c.MaxInFlight <= 0 {
		c.MaxInFlight = DefaultMaxInFlight
	}
	if c.HandshakeTimeout <= 0 {
		c.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if c.MaxConns <= 0 {
		c.MaxConns = DefaultMaxConns
	}
	if c.Lease <= 0 {
		c.Lease = DefaultLease
	}
	return c, nil
}

// Stack is the host side of the guest's only network link: a userspace
// TCP/IP stack (gVisor's netstack) that exchanges Ethernet frames with the
// guest's NIC over a datagram socket. It serves, on the gateway address:
// DHCP (the guest's one address), DNS on port 53 (UDP and TCP; names the
// policy allows get synthetic addresses, everything else NXDOMAIN), the
// explicit proxy on ProxyPort. Every other TCP connection the
// guest opens, to any address, is admitted only when its destination maps
// back to a name (or a rule names the IP) and the policy allows that name
// and port; it is then handed to the Engine, which does the upstream
// side. The Stack itself never opens a connection or sends a packet
// anywhere but to the guest. UDP other than DNS and DHCP, all ICMP (a ping
// to the gateway too), IPv6, IP fragments and frames that do not come from
// the guest's address are dropped.
type Stack struct {
	cfg    StackConfig
	engine Engine
	policy egress.StackPolicy
	events *eventLimiter
	log    *slog.Logger

	st    *stack.Stack
	link  *frameLink
	stats linkStats
	dns   *dnsServer
	dhcp  *dhcpServer

	gateway tcpip.Address
	guestIP [4]byte
	gwIP    [4]byte
	bcastIP [4]byte // the subnet's broadcast address

	dnsUDP   *gonet.UDPConn
	dhcpUDP  *gonet.UDPConn
	dnsTCP   *gonet.TCPListener
	proxyTCP *gonet.TCPListener

	served    atomic.Bool   // Serve ran (or Close stopped it from running)
	serveDone chan struct{} // closed when Serve has returned
	closeOnce sync.Once
	closed    chan struct{}
	shutOnce  sync.Once
	conns     atomic.Int64

	mu       sync.Mutex
	stopping bool
	wg       sync.WaitGroup
}

const nicID tcpip.NICID = 1

// Sizes of the gateway stack.
const (
	tcpBufDefault = 256 << 10 // TCP send and receive buffers, per connection, to start with
	tcpBufMax     = 4 << 20   // … and at most, once auto-tuning has grown them
	txQueueLen    = 1024      // frames waiting for the socket
)

// NewStack builds the stack for cfg. Admitted connections go to engine;
// policy decides names and ports; sink (nil: discarded) receives the
// stack's events: DNS answers and refusals, refused connections, dropped
// UDP and ICMP, all rate-limited per kind; log (nil: silent) receives
// diagnostics. Nothing is served until Serve.
func NewStack(cfg StackConfig, engine Engine, policy egress.StackPolicy, sink egress.EventSink, log *slog.Logger) (*Stack, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if engine == nil || policy == nil {
		return nil, errors.New("network stack: an engine and a policy are required")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	pool, err := newSynthPool(cfg.SyntheticRange)
	if err != nil {
		return nil, fmt.Errorf("network stack config: %w", err)
	}
	s := &Stack{
		cfg:       cfg,
		engine:    engine,
		policy:    policy,
		events:    newEventLimiter(sink),
		log:       log,
		gateway:   tcpip.AddrFrom4(cfg.Gateway.As4()),
		guestIP:   cfg.Guest.As4(),
		gwIP:      cfg.Gateway.As4(),
		bcastIP:   addAddr(cfg.Subnet.Addr(), uint32(1)<<(32-cfg.Subnet.Bits())-1).As4(),
		closed:    make(chan struct{}),
		serveDone: make(chan struct{}),
	}
	s.dns = &dnsServer{policy: policy, pool: pool, events: s.events, log: log}
	if cfg.Resolver != nil {
		s.dns.exist = newExistence(cfg.Resolver)
	}
	s.dhcp = &dhcpServer{
		gateway: cfg.Gateway, guest: cfg.Guest,
		mask:  net.CIDRMask(cfg.Subnet.Bits(), 32),
		mtu:   cfg.MTU,
		lease: cfg.Lease, guestMAC: cfg.GuestMAC, log: log,
	}
	if err := s.build(); err != nil {
		s.shutdown()
		return nil, err
	}
	return s, nil
}

func (s *Stack) build() error {
	s.st = stack.New(stack.Options{
		NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol, arp.NewProtocol},
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol, udp.NewProtocol},
	})
	for _, opt := range []tcpip.SettableTransportProtocolOption{
		nsPtr(tcpip.TCPSACKEnabled(true)),
		nsPtr(tcpip.TCPModerateReceiveBufferOption(true)),
		// Buffers start small (the guest can hold MaxConns connections
		// open) and grow with auto-tuning on busy connections.
		&tcpip.TCPReceiveBufferSizeRangeOption{Min: 4 << 10, Default: tcpBufDefault, Max: tcpBufMax},
		&tcpip.TCPSendBufferSizeRangeOption{Min: 4 << 10, Default: tcpBufDefault, Max: tcpBufMax},
	} {
		if err := s.st.SetTransportProtocolOption(tcp.ProtocolNumber, opt); err != nil {
			return fmt.Errorf("network stack: set TCP option %T: %s", opt, err)
		}
	}
	s.link = newFrameLink(uint32(s.cfg.MTU), tcpip.LinkAddress(s.cfg.GatewayMAC), &s.stats)
	s.link.arpReplyOK = s.arpAnswerable
	// A FIFO queue in front of the link hands it packets in batches, which
	// it sends with one system call where the platform allows.
	q := fifo.New(s.link, 1, txQueueLen)
	if err := s.st.CreateNICWithOptions(nicID, s.link, stack.NICOptions{QDisc: q}); err != nil {
		q.Close()
		return fmt.Errorf("network stack: create NIC: %s", err)
	}
	if err := s.st.AddProtocolAddress(nicID, tcpip.ProtocolAddress{
		Protocol:          ipv4.ProtocolNumber,
		AddressWithPrefix: tcpip.AddressWithPrefix{Address: s.gateway, PrefixLen: s.cfg.Subnet.Bits()},
	}, stack.AddressProperties{}); err != nil {
		return fmt.Errorf("network stack: add gateway address %s: %s", s.cfg.Gateway, err)
	}
	// Promiscuous: accept packets for any destination (every TCP
	// connection is terminated here). Spoofing: answer from the address
	// the guest dialled.
	if err := s.st.SetPromiscuousMode(nicID, true); err != nil {
		return fmt.Errorf("network stack: promiscuous mode: %s", err)
	}
	if err := s.st.SetSpoofing(nicID, true); err != nil {
		return fmt.Errorf("network stack: spoofing: %s", err)
	}
	subnet, err := tcpip.NewSubnet(tcpip.AddrFrom4(s.cfg.Subnet.Addr().As4()),
		tcpip.MaskFromBytes(net.CIDRMask(s.cfg.Subnet.Bits(), 32)))
	if err != nil {
		return fmt.Errorf("network stack: subnet %s: %v", s.cfg.Subnet, err)
	}
	s.st.SetRouteTable([]tcpip.Route{{Destination: subnet, NIC: nicID}})

	gw := tcpip.FullAddress{NIC: nicID, Addr: s.gateway}
	if s.dnsUDP, err = gonet.DialUDP(s.st, &tcpip.FullAddress{NIC: nicID, Addr: s.gateway, Port: 53}, nil, ipv4.ProtocolNumber); err != nil {
		return fmt.Errorf("network stack: DNS on %s:53/udp: %w", s.cfg.Gateway, err)
	}
	gw.Port = 53
	if s.dnsTCP, err = gonet.ListenTCP(s.st, gw, ipv4.ProtocolNumber); err != nil {
		return fmt.Errorf("network stack: DNS on %s:53/tcp: %w", s.cfg.Gateway, err)
	}
	gw.Port = s.cfg.ProxyPort
	if s.proxyTCP, err = gonet.ListenTCP(s.st, gw, ipv4.ProtocolNumber); err != nil {
		return fmt.Errorf("network stack: proxy on %s:%d: %w", s.cfg.Gateway, s.cfg.ProxyPort, err)
	}
	if s.dhcpUDP, err = s.dhcpConn(); err != nil {
		return fmt.Errorf("network stack: DHCP on port 67: %w", err)
	}
	return nil
}

func nsPtr[T any](v T) *T { return &v }

// dhcpConn binds UDP port 67 on every address of the NIC, broadcast
// allowed.
func (s *Stack) dhcpConn() (*gonet.UDPConn, error) {
	var wq waiter.Queue
	ep, terr := s.st.NewEndpoint(udp.ProtocolNumber, ipv4.ProtocolNumber, &wq)
	if terr != nil {
		return nil, errors.New(terr.String())
	}
	ep.SocketOptions().SetBroadcast(true)
	if terr := ep.Bind(tcpip.FullAddress{NIC: nicID, Port: dhcpServerPort}); terr != nil {
		ep.Close()
		return nil, errors.New(terr.String())
	}
	return gonet.NewUDPConn(&wq, ep), nil
}

// Config returns the effective configuration, defaults filled in.
func (s *Stack) Config() StackConfig { return s.cfg }

// ProxyURL is the explicit proxy's URL as the guest should use it in
// HTTP_PROXY and HTTPS_PROXY, e.g. "http://10.254.254.1:3128".
func (s *Stack) ProxyURL() string {
	return "http://" + netip.AddrPortFrom(s.cfg.Gateway, s.cfg.ProxyPort).String()
}

// Serve exchanges frames with the guest over conn, a connected datagram
// socket carrying one Ethernet frame per datagram (see SocketPair), and
// serves the network until ctx ends or Close is called. Serve runs once
// per Stack (ErrServed otherwise); when it returns, the stack is shut
// down: every guest connection is reset and Serve has waited for the
// Engine's handlers to return. It does not close conn. It returns nil
// when stopped through ctx or Close, and an error when conn fails.
func (s *Stack) Serve(ctx context.Context, conn net.Conn) error {
	if !s.served.CompareAndSwap(false, true) {
		return ErrServed
	}
	defer close(s.serveDone)
	select {
	case <-s.closed:
		s.shutdown()
		return ErrServed
	default:
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stopClose := context.AfterFunc(ctx, func() {
		past := time.Unix(1, 0)
		_ = conn.SetReadDeadline(past)
		_ = conn.SetWriteDeadline(past)
	})
	defer stopClose()
	go func() {
		select {
		case <-s.closed:
			cancel()
		case <-ctx.Done():
		}
	}()

	s.link.setConn(conn)
	fwd := tcp.NewForwarder(s.st, 0, s.cfg.MaxInFlight, func(r *tcp.ForwarderRequest) { s.admit(ctx, r) })
	s.st.SetTransportProtocolHandler(tcp.ProtocolNumber, fwd.HandlePacket)
	s.goTracked(func() { s.dns.serveUDP(ctx, s.dnsUDP, &s.wg) })
	s.goTracked(func() { s.dns.serveTCP(ctx, s.dnsTCP, &s.wg) })
	s.goTracked(func() { s.dhcp.serve(s.dhcpUDP) })
	s.goTracked(func() { s.serveProxy(ctx) })

	s.log.Info("guest network up", "gateway", s.cfg.Gateway.String(), "guest", s.cfg.Guest.String(),
		"mtu", s.cfg.MTU, "proxy", s.ProxyURL())
	err := s.readLoop(ctx)
	cancel()
	s.shutdown()
	s.link.setConn(nil)
	st := s.Stats()
	s.log.Info("guest network down", "frames_in", st.FramesIn, "frames_out", st.FramesOut,
		"dropped_spoofed", st.Spoofed, "dropped_udp", st.UDP, "dropped_icmp", st.ICMP, "err", err)
	return err
}

// readLoop reads frames until ctx ends or conn fails.
func (s *Stack) readLoop(ctx context.Context) error {
	for {
		err := s.link.readFrames(s.checkFrame)
		switch {
		case ctx.Err() != nil:
			return nil
		case isTimeout(err):
			continue // a deadline set by someone else: keep reading
		}
		return fmt.Errorf("read guest frames: %w", err)
	}
}

// track registers one goroutine that shutdown waits for; it returns false
// once shutdown has begun. A true return must be paired with s.wg.Done.
func (s *Stack) track() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopping {
		return false
	}
	s.wg.Add(1)
	return true
}

// goTracked runs f in a tracked goroutine; it returns false (and does not
// run f) once shutdown has begun.
func (s *Stack) goTracked(f func()) bool {
	if !s.track() {
		return false
	}
	go func() {
		defer s.wg.Done()
		f()
	}()
	return true
}

// shutdown stops serving and waits for every goroutine the stack started,
// Engine handlers included. It runs once.
func (s *Stack) shutdown() {
	s.shutOnce.Do(func() {
		s.mu.Lock()
		s.stopping = true
		s.mu.Unlock()
		// Closing the endpoints and the stack resets every guest
		// connection, so handlers blocked on them return.
		if s.dnsUDP != nil {
			s.dnsUDP.Close()
		}
		if s.dhcpUDP != nil {
			s.dhcpUDP.Close()
		}
		if s.dnsTCP != nil {
			s.dnsTCP.Close()
		}
		if s.proxyTCP != nil {
			s.proxyTCP.Close()
		}
		if s.st != nil {
			s.st.Close()
		}
		s.wg.Wait()
		if s.st != nil {
			s.st.Wait()
		}
		s.events.flush()
	})
}

// Close stops Serve and waits until it has shut the stack down or, if
// Serve never ran, releases the stack (Serve then returns ErrServed). It
// is safe to call more than once, but not from an Engine handler (Close
// waits for them).
func (s *Stack) Close() error {
	s.closeOnce.Do(func() { close(s.closed) })
	if s.served.CompareAndSwap(false, true) {
		close(s.serveDone)
		s.shutdown()
		return nil
	}
	<-s.serveDone
	return nil
}

// StackStats counts frames and drops since the stack was made.
type StackStats struct {
	FramesIn, FramesOut uint64
	BytesIn, BytesOut   uint64
	// Dropped frames, by reason.
	Malformed  uint64 // too short, bad headers, too long
	Spoofed    uint64 // source MAC or IP is not the guest's
	NotForUs   uint64 // destination MAC is neither the gateway's nor broadcast
	IPv6       uint64
	OtherProto uint64 // EtherTypes and IP protocols that are not served
	Fragments  uint64
	UDP        uint64 // UDP other than DNS and DHCP to the gateway
	ICMP       uint64 // all ICMP
	Multicast  uint64 // multicast and broadcast other than DHCP and ARP
	Martians   uint64 // TCP to loopback addresses
	// WriteErrors counts frames the socket refused; WriteNoBufs ENOBUFS
	// retries (macOS).
	WriteErrors, WriteNoBufs uint64
	// ConnsOpen is the number of connections the Engine holds now.
	ConnsOpen int64
	// HandshakeDrops counts guest SYNs dropped because every handshake
	// slot (MaxInFlight) was taken.
	HandshakeDrops uint64
}

// Stats returns a snapshot of the counters.
func (s *Stack) Stats() StackStats {
	st := &s.stats
	return StackStats{
		FramesIn: st.framesIn.Load(), FramesOut: st.framesOut.Load(),
		BytesIn: st.bytesIn.Load(), BytesOut: st.bytesOut.Load(),
		Malformed: st.malformed.Load(), Spoofed: st.spoofed.Load(), NotForUs: st.notForUs.Load(),
		IPv6: st.ipv6.Load(), OtherProto: st.otherProto.Load(), Fragments: st.fragments.Load(),
		UDP: st.udp.Load(), ICMP: st.icmp.Load(), Multicast: st.multicast.Load(), Martians: st.martians.Load(),
		WriteErrors: st.writeErrors.Load(), WriteNoBufs: st.writeNoBufs.Load(),
		ConnsOpen:      s.conns.Load(),
		HandshakeDrops: s.st.Stats().TCP.ForwardMaxInFlightDrop.Value(),
	}
}

// admit is the TCP forwarder's callback: it decides a guest's SYN, answers
// a refusal with RST and hands an admitted connection, handshake done, to
// the Engine.
func (s *Stack) admit(ctx context.Context, r *tcp.ForwarderRequest) {
	if !s.track() {
		r.Complete(true)
		return
	}
	defer s.wg.Done()
	id := r.ID()
	src := netip.AddrPortFrom(fromTCPIP(id.RemoteAddress), id.RemotePort)
	dst := netip.AddrPortFrom(fromTCPIP(id.LocalAddress), id.LocalPort)
	t, ok := s.decideConn(dst)
	t.Guest = src
	if ok && s.conns.Add(1) > int64(s.cfg.MaxConns) {
		s.conns.Add(-1)
		ok = false
		t.Decision = egress.Decision{Reason: fmt.Sprintf("too many open connections (%d); close some and retry", s.cfg.MaxConns)}
	}
	if !ok {
		r.Complete(true)
		s.refused(egress.Event{Kind: "connect", Name: t.Name, Port: t.Port, Src: src.String(), Dst: dst.String(),
			Decision: "deny", Rule: t.Decision.Rule, Reason: t.Decision.Reason})
		return
	}
	defer s.conns.Add(-1)
	var wq waiter.Queue
	// A handshake the guest never completes (SYN-ACKs it does not answer,
	// not even with an RST) would hold its MaxInFlight slot for gVisor's
	// whole SYN-ACK retransmission schedule, 127 s: a few seconds of SYN
	// flood would then leave every new connection dropped for two
	// minutes. Abort it after HandshakeTimeout instead.
	abort := time.AfterFunc(s.cfg.HandshakeTimeout, func() {
		if ep := s.st.FindTransportEndpoint(ipv4.ProtocolNumber, tcp.ProtocolNumber, id, nicID); ep != nil {
			ep.Abort()
		}
	})
	ep, terr := r.CreateEndpoint(&wq)
	if !abort.Stop() && terr == nil {
		ep.Close() // completed just as it was aborted
		terr = &tcpip.ErrTimeout{}
	}
	r.Complete(false)
	if terr != nil {
		s.log.Debug("guest connection failed during the handshake", "dst", dst.String(), "err", terr.String())
		return
	}
	conn := gonet.NewTCPConn(&wq, ep)
	if ctx.Err() != nil {
		conn.Close()
		return
	}
	s.engine.HandleConn(ctx, conn, t)
}

// decideConn decides a guest connection to dst. The Target it returns
// carries the name (or IP literal), port and the deciding Decision.
func (s *Stack) decideConn(dst netip.AddrPort) (Target, bool) {
	a, port := dst.Addr(), dst.Port()
	t := Target{Port: port, Dialled: dst}
	deny := func(reason string) (Target, bool) {
		t.Decision = egress.Decision{Reason: reason}
		return t, false
	}
	switch {
	case !a.Is4():
		return deny("not an IPv4 address")
	case s.cfg.SyntheticRange.Contains(a):
		name, ok := s.dns.pool.name(a)
		if !ok {
			return deny(fmt.Sprintf("%s was not handed out by the DNS server: connect by name", a))
		}
		t.Name = name
	case a == s.cfg.Gateway:
		return deny(fmt.Sprintf("the gateway serves only DNS (port 53) and the proxy (port %d)", s.cfg.ProxyPort))
	case s.cfg.Subnet.Contains(a):
		return deny("the guest network has no other hosts")
	case egress.NeverReachable(a):
		return deny(fmt.Sprintf("%s is never reachable from the guest", a))
	default:
		t.Name = a.String()
	}
	t.Decision = s.policy.Decide(t.Name, port)
	return t, t.Decision.Allow
}

// serveProxy hands each connection to the explicit proxy port to the
// Engine.
func (s *Stack) serveProxy(ctx context.Context) {
	for {
		c, err := s.proxyTCP.Accept()
		if err != nil {
			return
		}
		src, _ := netip.ParseAddrPort(c.RemoteAddr().String())
		if s.conns.Add(1) > int64(s.cfg.MaxConns) {
			s.conns.Add(-1)
			c.Close()
			s.refused(egress.Event{Kind: "proxy", Src: src.String(), Port: s.cfg.ProxyPort, Decision: "deny",
				Reason: fmt.Sprintf("too many open connections (%d); close some and retry", s.cfg.MaxConns)})
			continue
		}
		if !s.goTracked(func() {
			defer s.conns.Add(-1)
			s.engine.HandleProxyConn(ctx, c, src)
		}) {
			s.conns.Add(-1)
			c.Close()
			return
		}
	}
}

// refused records a refusal, rate-limited, and logs it at debug level when
// it was recorded.
func (s *Stack) refused(e egress.Event) {
	if s.events.record(e) {
		s.log.Debug("refused guest traffic", "kind", e.Kind, "name", e.Name, "dst", e.Dst, "reason", e.Reason)
	}
}

func fromTCPIP(a tcpip.Address) netip.Addr {
	if a.Len() == 4 {
		return netip.AddrFrom4(a.As4())
	}
	if a.Len() == 16 {
		return netip.AddrFrom16(a.As16())
	}
	return netip.Addr{}
}

func apString(a netip.AddrPort) string {
	if !a.IsValid() {
		return ""
	}
	return a.String()
}
