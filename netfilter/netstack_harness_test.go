package netfilter

import (
	"github.com/vibedom/vibedom/netfilter/egress"

	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/link/qdisc/fifo"
	"gvisor.dev/gvisor/pkg/tcpip/network/arp"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/icmp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"
)

// The test network: the Stack's defaults.
var (
	testGateway = netip.MustParseAddr("10.254.254.1")
	testGuestIP = netip.MustParseAddr("10.254.254.2")
	testGuestHW = net.HardwareAddr{0x02, 0x00, 0x00, 0x00, 0x00, 0x02}
	testGwHW, _ = net.ParseMAC(DefaultGatewayMAC)
)

// nsPolicy allows names (exact) on listed ports; an entry with no ports
// allows 443 and 80. IP literals are names like any other here.
type nsPolicy map[string][]uint16

func (p nsPolicy) ports(name string) ([]uint16, bool) {
	name = strings.TrimSuffix(strings.ToLower(name), ".")
	ports, ok := p[name]
	if ok && len(ports) == 0 {
		ports = []uint16{443, 80}
	}
	return ports, ok
}

func (p nsPolicy) Decide(name string, port uint16) egress.Decision {
	ports, ok := p.ports(name)
	if !ok {
		return egress.Decision{Reason: "no rule allows " + name}
	}
	for _, pt := range ports {
		if pt == port {
			return egress.Decision{Allow: true, Rule: name, Source: "test", Reason: "allowed"}
		}
	}
	return egress.Decision{Reason: name + ": other ports only"}
}

func (p nsPolicy) DecideName(name string) egress.Decision {
	if _, ok := p.ports(name); ok {
		return egress.Decision{Allow: true, Rule: name, Source: "test", Reason: "allowed"}
	}
	return egress.Decision{Reason: "no rule allows " + name}
}

// nsResolver says the names in exists exist, fails for those in fail,
// and records every name it is asked about.
type nsResolver struct {
	exists map[string]bool
	fail   map[string]bool

	mu    sync.Mutex
	asked []string
}

func (r *nsResolver) Exists(_ context.Context, name string) (bool, error) {
	r.mu.Lock()
	r.asked = append(r.asked, name)
	r.mu.Unlock()
	if r.fail[name] {
		return false, errors.New("upstream timeout")
	}
	return r.exists[name], nil
}

func (r *nsResolver) calls() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.asked...)
}

// nsAccepted is one connection the fake engine was handed.
type nsAccepted struct {
	target Target
	proxy  bool
	src    netip.AddrPort
}

// nsEngine records what it is handed and echoes (or, with discard,
// reads and drops; with send, writes send bytes and closes).
type nsEngine struct {
	got     chan nsAccepted
	discard bool
	send    int64
	hold    chan struct{} // when set, handlers wait for it before closing
}

func newNSEngine() *nsEngine { return &nsEngine{got: make(chan nsAccepted, 1024)} }

func (e *nsEngine) HandleConn(ctx context.Context, conn net.Conn, t Target) {
	defer conn.Close()
	select {
	case e.got <- nsAccepted{target: t}:
	default:
	}
	e.serve(ctx, conn)
}

func (e *nsEngine) HandleProxyConn(ctx context.Context, conn net.Conn, src netip.AddrPort) {
	defer conn.Close()
	select {
	case e.got <- nsAccepted{proxy: true, src: src}:
	default:
	}
	e.serve(ctx, conn)
}

func (e *nsEngine) serve(ctx context.Context, conn net.Conn) {
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	switch {
	case e.hold != nil:
		<-e.hold
	case e.discard:
		_, _ = io.Copy(io.Discard, conn)
	case e.send > 0:
		buf := make([]byte, 64<<10)
		for left := e.send; left > 0; {
			n := int64(len(buf))
			if left < n {
				n = left
			}
			w, err := conn.Write(buf[:n])
			if err != nil {
				return
			}
			left -= int64(w)
		}
	default:
		_, _ = io.Copy(conn, conn)
	}
}

// nsEvents is an EventSink that keeps everything.
type nsEvents struct {
	mu     sync.Mutex
	events []egress.Event
}

func (r *nsEvents) Record(e egress.Event) {
	r.mu.Lock()
	r.events = append(r.events, e)
	r.mu.Unlock()
}

func (r *nsEvents) all() []egress.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]egress.Event(nil), r.events...)
}

// waitFor waits up to a few seconds for an event matching match.
func (r *nsEvents) waitFor(t *testing.T, what string, match func(egress.Event) bool) egress.Event {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		for _, e := range r.all() {
			if match(e) {
				return e
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no event %s among %+v", what, r.all())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// nsNet is a Stack serving one end of a socket pair; the test holds the
// other end, as the VM would.
type nsNet struct {
	stack    *Stack
	engine   *nsEngine
	events   *nsEvents
	resolver *nsResolver
	vm       net.Conn // the guest's end
}

func startNSNet(t testing.TB, cfg StackConfig, pol egress.StackPolicy, eng *nsEngine) *nsNet {
	t.Helper()
	if eng == nil {
		eng = newNSEngine()
	}
	var resolver *nsResolver
	if cfg.Resolver == nil {
		resolver = &nsResolver{exists: map[string]bool{}, fail: map[string]bool{}}
		cfg.Resolver = resolver
	}
	n := startEngineNet(t, cfg, pol, eng)
	n.engine, n.resolver = eng, resolver
	return n
}

// nsGuest is a second gVisor stack playing the guest on the VM's end of
// the socket pair, configured as DHCP would configure it.
type nsGuest struct {
	st *stack.Stack
}

func (n *nsNet) guest(t testing.TB) *nsGuest {
	t.Helper()
	st := stack.New(stack.Options{
		NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol, arp.NewProtocol},
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol, udp.NewProtocol, icmp.NewProtocol4},
	})
	sack := tcpip.TCPSACKEnabled(true)
	st.SetTransportProtocolOption(tcp.ProtocolNumber, &sack)
	var stats linkStats
	link := newFrameLink(uint32(n.stack.cfg.MTU), tcpip.LinkAddress(testGuestHW), &stats)
	link.setConn(n.vm)
	if err := st.CreateNICWithOptions(1, link, stack.NICOptions{QDisc: fifo.New(link, 1, 1024)}); err != nil {
		t.Fatal(err)
	}
	if err := st.AddProtocolAddress(1, tcpip.ProtocolAddress{
		Protocol:          ipv4.ProtocolNumber,
		AddressWithPrefix: tcpip.AddressWithPrefix{Address: tcpip.AddrFrom4(testGuestIP.As4()), PrefixLen: 24},
	}, stack.AddressProperties{}); err != nil {
		t.Fatal(err)
	}
	sub, _ := tcpip.NewSubnet(tcpip.AddrFrom4([4]byte{10, 254, 254, 0}), tcpip.MaskFromBytes(net.CIDRMask(24, 32)))
	st.SetRouteTable([]tcpip.Route{
		{Destination: sub, NIC: 1},
		{Destination: header.IPv4EmptySubnet, Gateway: tcpip.AddrFrom4(testGateway.As4()), NIC: 1},
	})
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			err := link.readFrames(nil)
			select {
			case <-stop:
				return
			default:
			}
			if !isTimeout(err) {
				return
			}
		}
	}()
	t.Cleanup(func() {
		close(stop)
		n.vm.SetReadDeadline(time.Unix(1, 0))
		<-done
		st.Close()
		st.Wait()
	})
	return &nsGuest{st: st}
}

func fullAddr(ap netip.AddrPort) tcpip.FullAddress {
	return tcpip.FullAddress{NIC: 1, Addr: tcpip.AddrFrom4(ap.Addr().As4()), Port: ap.Port()}
}

// dial connects from the guest.
func (g *nsGuest) dial(ctx context.Context, dst netip.AddrPort) (*gonet.TCPConn, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return gonet.DialContextTCP(ctx, g.st, fullAddr(dst), ipv4.ProtocolNumber)
}

// udpExchange sends msg from the guest to dst and waits up to wait for one
// reply; it returns nil when none came.
func (g *nsGuest) udpExchange(t *testing.T, dst netip.AddrPort, msg []byte, wait time.Duration) []byte {
	t.Helper()
	c, err := gonet.DialUDP(g.st, nil, nsPtr(fullAddr(dst)), ipv4.ProtocolNumber)
	if err != nil {
		t.Fatalf("udp dial %s: %v", dst, err)
	}
	defer c.Close()
	if _, err := c.Write(msg); err != nil {
		t.Fatalf("udp send to %s: %v", dst, err)
	}
	c.SetReadDeadline(time.Now().Add(wait))
	buf := make([]byte, 4096)
	k, err := c.Read(buf)
	if err != nil {
		return nil
	}
	return buf[:k]
}

// dnsQuery builds a query for name and type.
func dnsQueryMsg(t testing.TB, id uint16, name string, typ dnsmessage.Type) []byte {
	t.Helper()
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: id, RecursionDesired: true})
	b.EnableCompression()
	if err := b.StartQuestions(); err != nil {
		t.Fatal(err)
	}
	if err := b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(name), Type: typ, Class: dnsmessage.ClassINET}); err != nil {
		t.Fatal(err)
	}
	msg, err := b.Finish()
	if err != nil {
		t.Fatal(err)
	}
	return msg
}

// lookup asks the gateway's DNS server over UDP from the guest.
func (g *nsGuest) lookup(t *testing.T, name string, typ dnsmessage.Type) dnsmessage.Message {
	t.Helper()
	reply := g.udpExchange(t, netip.AddrPortFrom(testGateway, 53), dnsQueryMsg(t, 0x1234, name, typ), 5*time.Second)
	if reply == nil {
		t.Fatalf("no DNS reply for %s %v", name, typ)
	}
	var m dnsmessage.Message
	if err := m.Unpack(reply); err != nil {
		t.Fatalf("unpack DNS reply for %s: %v", name, err)
	}
	if m.ID != 0x1234 || !m.Response {
		t.Fatalf("DNS reply for %s: id %#x response %v", name, m.ID, m.Response)
	}
	return m
}

// answerA returns the A record of m, if any.
func answerA(m dnsmessage.Message) (netip.Addr, bool) {
	for _, a := range m.Answers {
		if r, ok := a.Body.(*dnsmessage.AResource); ok {
			return netip.AddrFrom4(r.A), true
		}
	}
	return netip.Addr{}, false
}

// Raw frames, for the tests that play a guest misbehaving below TCP.

func nsEthFrame(dst, src net.HardwareAddr, typ uint16, payload []byte) []byte {
	f := make([]byte, ethHeaderLen, ethHeaderLen+len(payload))
	copy(f[0:6], dst)
	copy(f[6:12], src)
	binary.BigEndian.PutUint16(f[12:], typ)
	return append(f, payload...)
}

func ipv4Packet(src, dst netip.Addr, proto uint8, l4 []byte) []byte {
	p := make([]byte, header.IPv4MinimumSize+len(l4))
	ip := header.IPv4(p)
	ip.Encode(&header.IPv4Fields{
		TotalLength: uint16(len(p)),
		TTL:         64,
		Protocol:    proto,
		SrcAddr:     tcpip.AddrFrom4(src.As4()),
		DstAddr:     tcpip.AddrFrom4(dst.As4()),
	})
	ip.SetChecksum(^ip.CalculateChecksum())
	copy(p[header.IPv4MinimumSize:], l4)
	return p
}

func udpSegment(src, dst netip.AddrPort, data []byte) []byte {
	u := make([]byte, header.UDPMinimumSize+len(data))
	h := header.UDP(u)
	h.Encode(&header.UDPFields{SrcPort: src.Port(), DstPort: dst.Port(), Length: uint16(len(u))})
	copy(u[header.UDPMinimumSize:], data)
	xsum := header.PseudoHeaderChecksum(udp.ProtocolNumber, tcpip.AddrFrom4(src.Addr().As4()),
		tcpip.AddrFrom4(dst.Addr().As4()), uint16(len(u)))
	h.SetChecksum(^checksum.Checksum(u, xsum))
	return u
}

func tcpSYN(src, dst netip.AddrPort, seq uint32) []byte {
	b := make([]byte, header.TCPMinimumSize)
	h := header.TCP(b)
	h.Encode(&header.TCPFields{SrcPort: src.Port(), DstPort: dst.Port(), SeqNum: seq,
		DataOffset: header.TCPMinimumSize, Flags: header.TCPFlagSyn, WindowSize: 65535})
	xsum := header.PseudoHeaderChecksum(tcp.ProtocolNumber, tcpip.AddrFrom4(src.Addr().As4()),
		tcpip.AddrFrom4(dst.Addr().As4()), uint16(len(b)))
	h.SetChecksum(^checksum.Checksum(b, xsum))
	return b
}

func icmpEcho(id uint16) []byte {
	b := make([]byte, header.ICMPv4MinimumSize+8)
	h := header.ICMPv4(b)
	h.SetType(header.ICMPv4Echo)
	h.SetIdent(id)
	h.SetSequence(1)
	h.SetChecksum(^checksum.Checksum(b, 0))
	return b
}

// guestIPFrame is an IPv4 frame from the guest to the gateway's MAC.
func guestIPFrame(src, dst netip.Addr, proto uint8, l4 []byte) []byte {
	return nsEthFrame(testGwHW, testGuestHW, etherIPv4, ipv4Packet(src, dst, proto, l4))
}

// nsReadFrames collects frames arriving on the VM's end for wait.
func nsReadFrames(t *testing.T, vm net.Conn, wait time.Duration, until func([]byte) bool) [][]byte {
	t.Helper()
	var out [][]byte
	deadline := time.Now().Add(wait)
	buf := make([]byte, 70000)
	for {
		vm.SetReadDeadline(deadline)
		k, err := vm.Read(buf)
		if err != nil {
			vm.SetReadDeadline(time.Time{})
			return out
		}
		f := append([]byte(nil), buf[:k]...)
		out = append(out, f)
		if until != nil && until(f) {
			vm.SetReadDeadline(time.Time{})
			return out
		}
	}
}

// ipv4Of returns the IPv4 packet in an Ethernet frame, or nil.
func ipv4Of(f []byte) header.IPv4 {
	if len(f) < ethHeaderLen+header.IPv4MinimumSize || binary.BigEndian.Uint16(f[12:]) != etherIPv4 {
		return nil
	}
	return header.IPv4(f[ethHeaderLen:])
}

func gonetDialUDP(g *nsGuest, dst netip.AddrPort) (net.Conn, error) {
	return gonet.DialUDP(g.st, nil, nsPtr(fullAddr(dst)), ipv4.ProtocolNumber)
}

// nsDrain reads and discards frames arriving on the VM's end until stop is
// called, so a test that floods the stack is not blocked by its answers.
func nsDrain(vm net.Conn) (stop func()) {
	var quit atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 70000)
		for {
			if _, err := vm.Read(buf); err != nil {
				if quit.Load() {
					return
				}
				if errors.Is(err, os.ErrDeadlineExceeded) {
					continue
				}
				return
			}
		}
	}()
	return func() {
		quit.Store(true)
		vm.SetReadDeadline(time.Unix(1, 0))
		<-done
		vm.SetReadDeadline(time.Time{})
	}
}

// nsAnnounce plays the guest asking ARP for the gateway, which also teaches
// the gateway the guest's MAC, so raw-frame tests get answers without
// answering ARP themselves.
func nsAnnounce(t *testing.T, vm net.Conn) {
	t.Helper()
	p := make([]byte, 28)
	binary.BigEndian.PutUint16(p[0:], 1)
	binary.BigEndian.PutUint16(p[2:], etherIPv4)
	p[4], p[5] = 6, 4
	binary.BigEndian.PutUint16(p[6:], 1)
	copy(p[8:14], testGuestHW)
	g, gw := testGuestIP.As4(), testGateway.As4()
	copy(p[14:18], g[:])
	copy(p[24:28], gw[:])
	if _, err := vm.Write(nsEthFrame(broadcastMAC, testGuestHW, etherARP, p)); err != nil {
		t.Fatal(err)
	}
	got := nsReadFrames(t, vm, 5*time.Second, func(f []byte) bool {
		return binary.BigEndian.Uint16(f[12:]) == etherARP
	})
	if len(got) == 0 {
		t.Fatal("the gateway did not answer ARP")
	}
}

func nsDiscardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }
