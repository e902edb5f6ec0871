// Package stacktest plays the guest against netfilter/netstack in tests: a
// second gVisor stack on the VM's end of the socket pair (NewGuest, with
// Dial, Lookup and UDPExchange), raw Ethernet/IPv4/UDP/TCP/ICMP frames for
// a guest that misbehaves below TCP, DNS queries, a map policy, a
// recording resolver and event sink, and the test network's addresses.
//
// It is imported by tests only, and does not import the stack: the caller
// hands it the link (netstack.NewLink) and the serve function.
package stacktest

import (
	"github.com/vibedom/vibedom/netfilter/egress"

	"context"
	"encoding/binary"
	"errors"
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
	Gateway      = netip.MustParseAddr("10.254.254.1")
	GuestIP      = netip.MustParseAddr("10.254.254.2")
	GuestHW      = net.HardwareAddr{0x02, 0x00, 0x00, 0x00, 0x00, 0x02}
	GatewayHW, _ = net.ParseMAC("02:76:64:00:00:01") // netstack.DefaultGatewayMAC
)

// Policy allows names (exact) on listed ports; an entry with no ports
// allows 443 and 80. IP literals are names like any other here.
type Policy map[string][]uint16

func (p Policy) ports(name string) ([]uint16, bool) {
	name = strings.TrimSuffix(strings.ToLower(name), ".")
	ports, ok := p[name]
	if ok && len(ports) == 0 {
		ports = []uint16{443, 80}
	}
	return ports, ok
}

// Decide implements egress.StackPolicy.
func (p Policy) Decide(name string, port uint16) egress.Decision {
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

// DecideName implements egress.StackPolicy.
func (p Policy) DecideName(name string) egress.Decision {
	if _, ok := p.ports(name); ok {
		return egress.Decision{Allow: true, Rule: name, Source: "test", Reason: "allowed"}
	}
	return egress.Decision{Reason: "no rule allows " + name}
}

// Resolver says the names in Known exist, fails for those in Fail,
// and records every name it is asked about.
type Resolver struct {
	Known map[string]bool
	Fail  map[string]bool

	mu    sync.Mutex
	asked []string
}

// Exists implements netstack.Resolver.
func (r *Resolver) Exists(_ context.Context, name string) (bool, error) {
	r.mu.Lock()
	r.asked = append(r.asked, name)
	r.mu.Unlock()
	if r.Fail[name] {
		return false, errors.New("upstream timeout")
	}
	return r.Known[name], nil
}

// Calls returns the names asked about, in order.
func (r *Resolver) Calls() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.asked...)
}

// Events is an EventSink that keeps everything.
type Events struct {
	mu     sync.Mutex
	events []egress.Event
}

// Record implements egress.EventSink.
func (r *Events) Record(e egress.Event) {
	r.mu.Lock()
	r.events = append(r.events, e)
	r.mu.Unlock()
}

// All returns the events recorded so far.
func (r *Events) All() []egress.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]egress.Event(nil), r.events...)
}

// WaitFor waits up to a few seconds for an event matching match.
func (r *Events) WaitFor(t *testing.T, what string, match func(egress.Event) bool) egress.Event {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		for _, e := range r.All() {
			if match(e) {
				return e
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no event %s among %+v", what, r.All())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Guest is a second gVisor stack playing the guest on the VM's end of
// the socket pair, configured as DHCP would configure it.
type Guest struct {
	st *stack.Stack
}

// NewGuest starts a guest stack on link (netstack.NewLink over vm), read
// delivering vm's frames to it, until the test ends.
func NewGuest(t testing.TB, vm net.Conn, link stack.LinkEndpoint, read func() error) *Guest {
	t.Helper()
	st := stack.New(stack.Options{
		NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol, arp.NewProtocol},
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol, udp.NewProtocol, icmp.NewProtocol4},
	})
	sack := tcpip.TCPSACKEnabled(true)
	st.SetTransportProtocolOption(tcp.ProtocolNumber, &sack)
	if err := st.CreateNICWithOptions(1, link, stack.NICOptions{QDisc: fifo.New(link, 1, 1024)}); err != nil {
		t.Fatal(err)
	}
	if err := st.AddProtocolAddress(1, tcpip.ProtocolAddress{
		Protocol:          ipv4.ProtocolNumber,
		AddressWithPrefix: tcpip.AddressWithPrefix{Address: tcpip.AddrFrom4(GuestIP.As4()), PrefixLen: 24},
	}, stack.AddressProperties{}); err != nil {
		t.Fatal(err)
	}
	sub, _ := tcpip.NewSubnet(tcpip.AddrFrom4([4]byte{10, 254, 254, 0}), tcpip.MaskFromBytes(net.CIDRMask(24, 32)))
	st.SetRouteTable([]tcpip.Route{
		{Destination: sub, NIC: 1},
		{Destination: header.IPv4EmptySubnet, Gateway: tcpip.AddrFrom4(Gateway.As4()), NIC: 1},
	})
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			err := read()
			select {
			case <-stop:
				return
			default:
			}
			if !errors.Is(err, os.ErrDeadlineExceeded) {
				return
			}
		}
	}()
	t.Cleanup(func() {
		close(stop)
		vm.SetReadDeadline(time.Unix(1, 0))
		<-done
		st.Close()
		st.Wait()
	})
	return &Guest{st: st}
}

// FullAddr is ap on the guest's NIC.
func FullAddr(ap netip.AddrPort) tcpip.FullAddress {
	return tcpip.FullAddress{NIC: 1, Addr: tcpip.AddrFrom4(ap.Addr().As4()), Port: ap.Port()}
}

// Dial connects from the guest.
func (g *Guest) Dial(ctx context.Context, dst netip.AddrPort) (*gonet.TCPConn, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return gonet.DialContextTCP(ctx, g.st, FullAddr(dst), ipv4.ProtocolNumber)
}

// UDPExchange sends msg from the guest to dst and waits up to wait for one
// reply; it returns nil when none came.
func (g *Guest) UDPExchange(t *testing.T, dst netip.AddrPort, msg []byte, wait time.Duration) []byte {
	t.Helper()
	c, err := gonet.DialUDP(g.st, nil, ptr(FullAddr(dst)), ipv4.ProtocolNumber)
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

// DNSQuery builds a query for name and type.
func DNSQuery(t testing.TB, id uint16, name string, typ dnsmessage.Type) []byte {
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

// Lookup asks the gateway's DNS server over UDP from the guest.
func (g *Guest) Lookup(t *testing.T, name string, typ dnsmessage.Type) dnsmessage.Message {
	t.Helper()
	reply := g.UDPExchange(t, netip.AddrPortFrom(Gateway, 53), DNSQuery(t, 0x1234, name, typ), 5*time.Second)
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

// AnswerA returns the A record of m, if any.
func AnswerA(m dnsmessage.Message) (netip.Addr, bool) {
	for _, a := range m.Answers {
		if r, ok := a.Body.(*dnsmessage.AResource); ok {
			return netip.AddrFrom4(r.A), true
		}
	}
	return netip.Addr{}, false
}

// Raw frames, for the tests that play a guest misbehaving below TCP.

// EthFrame is an Ethernet frame from src to dst of EtherType typ.
func EthFrame(dst, src net.HardwareAddr, typ uint16, payload []byte) []byte {
	f := make([]byte, header.EthernetMinimumSize, header.EthernetMinimumSize+len(payload))
	copy(f[0:6], dst)
	copy(f[6:12], src)
	binary.BigEndian.PutUint16(f[12:], typ)
	return append(f, payload...)
}

// IPv4Packet is an IPv4 packet of protocol proto around l4.
func IPv4Packet(src, dst netip.Addr, proto uint8, l4 []byte) []byte {
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

// UDPSegment is a UDP datagram from src to dst.
func UDPSegment(src, dst netip.AddrPort, data []byte) []byte {
	u := make([]byte, header.UDPMinimumSize+len(data))
	h := header.UDP(u)
	h.Encode(&header.UDPFields{SrcPort: src.Port(), DstPort: dst.Port(), Length: uint16(len(u))})
	copy(u[header.UDPMinimumSize:], data)
	xsum := header.PseudoHeaderChecksum(udp.ProtocolNumber, tcpip.AddrFrom4(src.Addr().As4()),
		tcpip.AddrFrom4(dst.Addr().As4()), uint16(len(u)))
	h.SetChecksum(^checksum.Checksum(u, xsum))
	return u
}

// TCPSYN is a TCP SYN from src to dst with sequence number seq.
func TCPSYN(src, dst netip.AddrPort, seq uint32) []byte {
	b := make([]byte, header.TCPMinimumSize)
	h := header.TCP(b)
	h.Encode(&header.TCPFields{SrcPort: src.Port(), DstPort: dst.Port(), SeqNum: seq,
		DataOffset: header.TCPMinimumSize, Flags: header.TCPFlagSyn, WindowSize: 65535})
	xsum := header.PseudoHeaderChecksum(tcp.ProtocolNumber, tcpip.AddrFrom4(src.Addr().As4()),
		tcpip.AddrFrom4(dst.Addr().As4()), uint16(len(b)))
	h.SetChecksum(^checksum.Checksum(b, xsum))
	return b
}

// ICMPEcho is an ICMP echo request.
func ICMPEcho(id uint16) []byte {
	b := make([]byte, header.ICMPv4MinimumSize+8)
	h := header.ICMPv4(b)
	h.SetType(header.ICMPv4Echo)
	h.SetIdent(id)
	h.SetSequence(1)
	h.SetChecksum(^checksum.Checksum(b, 0))
	return b
}

// GuestIPFrame is an IPv4 frame from the guest to the gateway's MAC.
func GuestIPFrame(src, dst netip.Addr, proto uint8, l4 []byte) []byte {
	return EthFrame(GatewayHW, GuestHW, uint16(ipv4.ProtocolNumber), IPv4Packet(src, dst, proto, l4))
}

// ReadFrames collects frames arriving on the VM's end for wait.
func ReadFrames(t *testing.T, vm net.Conn, wait time.Duration, until func([]byte) bool) [][]byte {
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

// IPv4Of returns the IPv4 packet in an Ethernet frame, or nil.
func IPv4Of(f []byte) header.IPv4 {
	if len(f) < header.EthernetMinimumSize+header.IPv4MinimumSize || binary.BigEndian.Uint16(f[12:]) != uint16(ipv4.ProtocolNumber) {
		return nil
	}
	return header.IPv4(f[header.EthernetMinimumSize:])
}

// DialUDP opens a UDP socket from the guest to dst.
func DialUDP(g *Guest, dst netip.AddrPort) (net.Conn, error) {
	return gonet.DialUDP(g.st, nil, ptr(FullAddr(dst)), ipv4.ProtocolNumber)
}

// Drain reads and discards frames arriving on the VM's end until stop is
// called, so a test that floods the stack is not blocked by its answers.
func Drain(vm net.Conn) (stop func()) {
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

// Announce plays the guest asking ARP for the gateway, which also teaches
// the gateway the guest's MAC, so raw-frame tests get answers without
// answering ARP themselves.
func Announce(t *testing.T, vm net.Conn) {
	t.Helper()
	p := make([]byte, 28)
	binary.BigEndian.PutUint16(p[0:], 1)
	binary.BigEndian.PutUint16(p[2:], uint16(ipv4.ProtocolNumber))
	p[4], p[5] = 6, 4
	binary.BigEndian.PutUint16(p[6:], 1)
	copy(p[8:14], GuestHW)
	g, gw := GuestIP.As4(), Gateway.As4()
	copy(p[14:18], g[:])
	copy(p[24:28], gw[:])
	if _, err := vm.Write(EthFrame(broadcastHW, GuestHW, uint16(arp.ProtocolNumber), p)); err != nil {
		t.Fatal(err)
	}
	got := ReadFrames(t, vm, 5*time.Second, func(f []byte) bool {
		return binary.BigEndian.Uint16(f[12:]) == uint16(arp.ProtocolNumber)
	})
	if len(got) == 0 {
		t.Fatal("the gateway did not answer ARP")
	}
}

// DiscardLogger logs nothing.
func DiscardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

var broadcastHW = net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

func ptr[T any](v T) *T { return &v }

// Serve serves host, the stack's end of a socket pair, with serve until
// the test ends (serve must return nil once its context is cancelled), and
// returns the guest's end made from vmFile.
func Serve(t testing.TB, host net.Conn, vmFile *os.File, serve func(ctx context.Context, host net.Conn) error) net.Conn {
	t.Helper()
	vm, err := net.FileConn(vmFile)
	vmFile.Close()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve(ctx, host) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
		host.Close()
		vm.Close()
	})
	return vm
}
