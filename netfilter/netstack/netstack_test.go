package netstack

import (
	"github.com/vibedom/vibedom/netfilter/egress"
	"github.com/vibedom/vibedom/netfilter/internal/stacktest"

	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

func testPolicyAllow() stacktest.Policy {
	return stacktest.Policy{
		"api.example.com":   {443},
		"www.example.com":   nil, // 443 and 80
		"git.example.com":   {22},
		"gone.example.com":  nil,
		"flaky.example.com": nil,
		"203.0.113.7":       {443}, // an IP literal rule
		"127.0.0.1":         {443}, // never honoured: loopback is unreachable by construction
		"10.254.254.1":      {22},  // nor is the gateway
	}
}

func TestStackConfig(t *testing.T) {
	tests := []struct {
		name    string
		cfg     StackConfig
		wantErr string
	}{
		{"zero value", StackConfig{}, ""},
		{"custom subnet", StackConfig{Subnet: netip.MustParsePrefix("192.168.127.0/24")}, ""},
		{"ipv6 subnet", StackConfig{Subnet: netip.MustParsePrefix("fd00::/64")}, "IPv4 prefix"},
		{"gateway outside", StackConfig{Gateway: netip.MustParseAddr("10.0.0.1")}, "not a host address"},
		{"guest is broadcast", StackConfig{Guest: netip.MustParseAddr("10.254.254.255")}, "not a host address"},
		{"same addresses", StackConfig{Guest: netip.MustParseAddr("10.254.254.1")}, "share the address"},
		{"overlapping synthetic range", StackConfig{SyntheticRange: netip.MustParsePrefix("10.254.0.0/16")}, "overlaps"},
		{"MTU too small", StackConfig{MTU: 100}, "MTU"},
		{"multicast MAC", StackConfig{GuestMAC: net.HardwareAddr{1, 0, 0, 0, 0, 1}}, "unicast"},
		{"proxy on 53", StackConfig{ProxyPort: 53}, "DNS"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := NewStack(tt.cfg, newNSEngine(), stacktest.Policy{}, nil, nil)
			if s != nil {
				defer s.Close()
			}
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("NewStack: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("NewStack error: got %v, want one mentioning %q", err, tt.wantErr)
			}
		})
	}
	t.Run("defaults", func(t *testing.T) {
		s, err := NewStack(StackConfig{}, newNSEngine(), stacktest.Policy{}, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		c := s.Config()
		if c.Gateway != stacktest.Gateway || c.Guest != stacktest.GuestIP || c.MTU != 1500 || c.ProxyPort != 3128 {
			t.Errorf("defaults: got gateway %v guest %v MTU %d proxy %d", c.Gateway, c.Guest, c.MTU, c.ProxyPort)
		}
		if got, want := s.ProxyURL(), "http://10.254.254.1:3128"; got != want {
			t.Errorf("ProxyURL: got %q, want %q", got, want)
		}
	})
}

func TestStackServeOnce(t *testing.T) {
	s, err := NewStack(StackConfig{}, newNSEngine(), stacktest.Policy{}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	host, vm, err := SocketPair()
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	defer vm.Close()
	done := make(chan error, 1)
	go func() { done <- s.Serve(t.Context(), host) }()
	// Close stops a running Serve and waits for it.
	time.Sleep(10 * time.Millisecond)
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := <-done; err != nil && !errors.Is(err, ErrServed) {
		t.Fatalf("Serve after Close: got %v, want nil", err)
	}
	if err := s.Serve(t.Context(), host); !errors.Is(err, ErrServed) {
		t.Fatalf("second Serve: got %v, want ErrServed", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

func TestStackDHCP(t *testing.T) {
	t.Parallel()
	n := startNSNet(t, StackConfig{GuestMAC: stacktest.GuestHW}, stacktest.Policy{}, nil)
	bootp := func(typ byte, mac net.HardwareAddr, requested netip.Addr) []byte {
		b := make([]byte, dhcpFixedLen)
		b[0], b[1], b[2] = 1, 1, 6
		copy(b[4:8], []byte{0xde, 0xad, 0xbe, 0xef})
		copy(b[28:34], mac)
		b = append(b, dhcpMagic...)
		b = append(b, optMsgType, 1, typ)
		if requested.IsValid() {
			a := requested.As4()
			b = append(b, optRequestedIP, 4, a[0], a[1], a[2], a[3])
		}
		return append(b, optEnd)
	}
	send := func(t *testing.T, mac net.HardwareAddr, msg []byte) {
		src := netip.AddrPortFrom(netip.IPv4Unspecified(), 68)
		dst := netip.AddrPortFrom(netip.AddrFrom4([4]byte{255, 255, 255, 255}), 67)
		f := stacktest.EthFrame(broadcastMAC, mac, etherIPv4, stacktest.IPv4Packet(src.Addr(), dst.Addr(), protoUDP, stacktest.UDPSegment(src, dst, msg)))
		if _, err := n.vm.Write(f); err != nil {
			t.Fatal(err)
		}
	}
	// reply waits for a DHCP reply and returns its BOOTP message.
	reply := func(t *testing.T, wait time.Duration) []byte {
		var msg []byte
		stacktest.ReadFrames(t, n.vm, wait, func(f []byte) bool {
			ip := stacktest.IPv4Of(f)
			if ip == nil || ip.Protocol() != protoUDP {
				return false
			}
			u := header.UDP(ip.Payload())
			if u.DestinationPort() != 68 || u.SourcePort() != 67 {
				return false
			}
			msg = u.Payload()
			return true
		})
		return msg
	}
	options := func(t *testing.T, msg []byte) map[byte][]byte {
		if len(msg) < dhcpFixedLen+4 || !bytes.Equal(msg[dhcpFixedLen:dhcpFixedLen+4], dhcpMagic) {
			t.Fatalf("reply is not a DHCP message: %x", msg)
		}
		opts := map[byte][]byte{}
		b := msg[dhcpFixedLen+4:]
		for i := 0; i < len(b) && b[i] != optEnd; {
			if b[i] == optPad {
				i++
				continue
			}
			opts[b[i]] = b[i+2 : i+2+int(b[i+1])]
			i += 2 + int(b[i+1])
		}
		return opts
	}
	gw := stacktest.Gateway.As4()
	tests := []struct {
		name      string
		mac       net.HardwareAddr
		typ       byte
		requested netip.Addr
		wantType  byte // 0: no reply
		wantAddr  netip.Addr
	}{
		{"discover gets an offer", stacktest.GuestHW, dhcpDiscover, netip.Addr{}, dhcpOffer, stacktest.GuestIP},
		{"request for the offered address gets an ack", stacktest.GuestHW, dhcpRequest, stacktest.GuestIP, dhcpAck, stacktest.GuestIP},
		{"request for another address gets a nak", stacktest.GuestHW, dhcpRequest, netip.MustParseAddr("10.254.254.9"), dhcpNak, netip.IPv4Unspecified()},
		{"another client gets nothing", net.HardwareAddr{2, 0, 0, 0, 0, 9}, dhcpDiscover, netip.Addr{}, 0, netip.Addr{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			send(t, tt.mac, bootp(tt.typ, tt.mac, tt.requested))
			wait := 5 * time.Second
			if tt.wantType == 0 {
				wait = 300 * time.Millisecond
			}
			msg := reply(t, wait)
			if tt.wantType == 0 {
				if msg != nil {
					t.Fatalf("got a reply for a foreign client: %x", msg)
				}
				return
			}
			if msg == nil {
				t.Fatal("no DHCP reply")
			}
			opts := options(t, msg)
			if got := opts[optMsgType]; len(got) != 1 || got[0] != tt.wantType {
				t.Errorf("message type: got %v, want %d", got, tt.wantType)
			}
			if got := netip.AddrFrom4([4]byte(msg[16:20])); got != tt.wantAddr {
				t.Errorf("yiaddr: got %v, want %v", got, tt.wantAddr)
			}
			if !bytes.Equal(msg[4:8], []byte{0xde, 0xad, 0xbe, 0xef}) {
				t.Errorf("xid: got %x", msg[4:8])
			}
			if got := opts[optServerID]; !bytes.Equal(got, gw[:]) {
				t.Errorf("server id: got %v, want %v", got, gw)
			}
			if tt.wantType == dhcpNak {
				if _, ok := opts[optRouter]; ok {
					t.Errorf("a NAK carries a router option")
				}
				return
			}
			for code, want := range map[byte][]byte{
				optRouter:     gw[:],
				optDNS:        gw[:],
				optSubnetMask: {255, 255, 255, 0},
			} {
				if got := opts[code]; !bytes.Equal(got, want) {
					t.Errorf("option %d: got %v, want %v", code, got, want)
				}
			}
			if got := opts[optLeaseTime]; len(got) != 4 || binary.BigEndian.Uint32(got) != uint32(DefaultLease/time.Second) {
				t.Errorf("lease time: got %v", got)
			}
			for code := range opts {
				if !slices.Contains([]byte{optMsgType, optServerID, optLeaseTime, optRenewalT1, optRebindT2,
					optSubnetMask, optRouter, optDNS}, code) {
					t.Errorf("unexpected option %d offered", code)
				}
			}
		})
	}
}

func TestStackDNS(t *testing.T) {
	n := startNSNet(t, StackConfig{}, testPolicyAllow(), nil)
	n.resolver.Known["api.example.com"] = true
	n.resolver.Known["www.example.com"] = true
	n.resolver.Fail["flaky.example.com"] = true
	g := n.guest(t)

	first := g.Lookup(t, "api.example.com.", dnsmessage.TypeA)
	apiAddr, ok := stacktest.AnswerA(first)
	if !ok || first.RCode != dnsmessage.RCodeSuccess {
		t.Fatalf("api.example.com: got rcode %v answers %v, want one A record", first.RCode, first.Answers)
	}
	if !DefaultSyntheticRange.Contains(apiAddr) {
		t.Fatalf("api.example.com: got %v, want an address in %v", apiAddr, DefaultSyntheticRange)
	}

	tests := []struct {
		name      string
		qname     string
		qtype     dnsmessage.Type
		wantRCode dnsmessage.RCode
		wantA     netip.Addr // valid: this exact answer; else no A record
		wantAsked bool       // the upstream resolver is consulted
		wantEvent string     // decision of the recorded event, "" for none expected
	}{
		{"same name same address", "api.example.com.", dnsmessage.TypeA, dnsmessage.RCodeSuccess, apiAddr, false, ""},
		{"case-insensitive", "API.Example.COM.", dnsmessage.TypeA, dnsmessage.RCodeSuccess, apiAddr, false, ""},
		{"AAAA gets no data", "api.example.com.", dnsmessage.TypeAAAA, dnsmessage.RCodeSuccess, netip.Addr{}, false, ""},
		{"TXT gets no data", "api.example.com.", dnsmessage.TypeTXT, dnsmessage.RCodeSuccess, netip.Addr{}, false, ""},
		{"MX gets no data", "www.example.com.", dnsmessage.TypeMX, dnsmessage.RCodeSuccess, netip.Addr{}, true, "allow"},
		{"denied name", "evil.example.net.", dnsmessage.TypeA, dnsmessage.RCodeNameError, netip.Addr{}, false, "deny"},
		{"denied name TXT", "c2VjcmV0.evil.example.net.", dnsmessage.TypeTXT, dnsmessage.RCodeNameError, netip.Addr{}, false, "deny"},
		{"denied subdomain of an allowed name", "x.api.example.com.", dnsmessage.TypeA, dnsmessage.RCodeNameError, netip.Addr{}, false, "deny"},
		{"allowed but missing upstream", "gone.example.com.", dnsmessage.TypeA, dnsmessage.RCodeNameError, netip.Addr{}, true, "error"},
		{"upstream failure", "flaky.example.com.", dnsmessage.TypeA, dnsmessage.RCodeServerFailure, netip.Addr{}, true, "error"},
		{"reverse lookup", "7.113.0.203.in-addr.arpa.", dnsmessage.TypePTR, dnsmessage.RCodeNameError, netip.Addr{}, false, "deny"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := len(n.resolver.Calls())
			m := g.Lookup(t, tt.qname, tt.qtype)
			if m.RCode != tt.wantRCode {
				t.Errorf("rcode: got %v, want %v", m.RCode, tt.wantRCode)
			}
			a, ok := stacktest.AnswerA(m)
			if tt.wantA.IsValid() {
				if !ok || a != tt.wantA {
					t.Errorf("answer: got %v (%v), want %v", a, ok, tt.wantA)
				}
			} else if len(m.Answers) != 0 {
				t.Errorf("answers: got %v, want none", m.Answers)
			}
			if len(m.Questions) != 1 || !strings.EqualFold(m.Questions[0].Name.String(), tt.qname) {
				t.Errorf("question not echoed: %v", m.Questions)
			}
			asked := n.resolver.Calls()[before:]
			if got := len(asked) > 0; got != tt.wantAsked {
				t.Errorf("resolver asked: got %v, want %v", asked, tt.wantAsked)
			}
			if tt.wantEvent != "" {
				name := strings.ToLower(strings.TrimSuffix(tt.qname, "."))
				n.events.WaitFor(t, "dns "+tt.wantEvent+" "+name, func(e egress.Event) bool {
					return e.Kind == "dns" && e.Name == name && e.Decision == tt.wantEvent
				})
			}
		})
	}

	t.Run("denied names never reach the resolver", func(t *testing.T) {
		for _, name := range n.resolver.Calls() {
			if d := testPolicyAllow().DecideName(name); !d.Allow {
				t.Errorf("resolver was asked about the denied name %q", name)
			}
		}
	})
	t.Run("distinct names get distinct addresses", func(t *testing.T) {
		a, _ := stacktest.AnswerA(g.Lookup(t, "www.example.com.", dnsmessage.TypeA))
		if a == apiAddr || !a.IsValid() {
			t.Errorf("www.example.com: got %v, api.example.com has %v", a, apiAddr)
		}
	})
	t.Run("over TCP", func(t *testing.T) {
		c, err := g.Dial(t.Context(), netip.AddrPortFrom(stacktest.Gateway, 53))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		for _, q := range []struct {
			name  string
			rcode dnsmessage.RCode
		}{{"api.example.com.", dnsmessage.RCodeSuccess}, {"evil.example.net.", dnsmessage.RCodeNameError}} {
			msg := stacktest.DNSQuery(t, 7, q.name, dnsmessage.TypeA)
			if _, err := c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(msg))), msg...)); err != nil {
				t.Fatal(err)
			}
			var l [2]byte
			if _, err := io.ReadFull(c, l[:]); err != nil {
				t.Fatal(err)
			}
			reply := make([]byte, binary.BigEndian.Uint16(l[:]))
			if _, err := io.ReadFull(c, reply); err != nil {
				t.Fatal(err)
			}
			var m dnsmessage.Message
			if err := m.Unpack(reply); err != nil {
				t.Fatal(err)
			}
			if m.RCode != q.rcode {
				t.Errorf("%s over TCP: got %v, want %v", q.name, m.RCode, q.rcode)
			}
			if a, _ := stacktest.AnswerA(m); q.rcode == dnsmessage.RCodeSuccess && a != apiAddr {
				t.Errorf("%s over TCP: got %v, want %v", q.name, a, apiAddr)
			}
		}
	})
	t.Run("Go resolver", func(t *testing.T) {
		r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
			if strings.HasPrefix(network, "tcp") {
				return g.Dial(ctx, netip.AddrPortFrom(stacktest.Gateway, 53))
			}
			return stacktest.DialUDP(g, netip.AddrPortFrom(stacktest.Gateway, 53))
		}}
		addrs, err := r.LookupNetIP(t.Context(), "ip4", "api.example.com.")
		if err != nil || len(addrs) != 1 || addrs[0] != apiAddr {
			t.Errorf("LookupNetIP(api.example.com): got %v, %v, want [%v]", addrs, err, apiAddr)
		}
		_, err = r.LookupNetIP(t.Context(), "ip", "evil.example.net.")
		var dnsErr *net.DNSError
		if !errors.As(err, &dnsErr) || !dnsErr.IsNotFound {
			t.Errorf("LookupNetIP(evil.example.net): got %v, want not found", err)
		}
	})
}

func TestStackTCPAdmission(t *testing.T) {
	n := startNSNet(t, StackConfig{}, testPolicyAllow(), nil)
	for _, name := range []string{"api.example.com", "www.example.com", "git.example.com"} {
		n.resolver.Known[name] = true
	}
	g := n.guest(t)
	addrOf := func(name string) netip.Addr {
		a, ok := stacktest.AnswerA(g.Lookup(t, name+".", dnsmessage.TypeA))
		if !ok {
			t.Fatalf("no address for %s", name)
		}
		return a
	}
	api, www, git := addrOf("api.example.com"), addrOf("www.example.com"), addrOf("git.example.com")
	never := netip.MustParseAddr("198.18.200.1") // in the range, never handed out

	tests := []struct {
		name     string
		dst      netip.AddrPort
		wantName string // "" when refused
	}{
		{"allowed name and port", netip.AddrPortFrom(api, 443), "api.example.com"},
		{"allowed name, default port 80", netip.AddrPortFrom(www, 80), "www.example.com"},
		{"allowed non-HTTP port", netip.AddrPortFrom(git, 22), "git.example.com"},
		{"IP literal named by a rule", netip.MustParseAddrPort("203.0.113.7:443"), "203.0.113.7"},
		{"allowed name, denied port", netip.AddrPortFrom(api, 8443), ""},
		{"allowed name, port 80 not listed", netip.AddrPortFrom(api, 80), ""},
		{"synthetic address never handed out", netip.AddrPortFrom(never, 443), ""},
		{"IP literal on another port", netip.MustParseAddrPort("203.0.113.7:80"), ""},
		{"public IP", netip.MustParseAddrPort("93.184.216.34:443"), ""},
		{"public resolver", netip.MustParseAddrPort("8.8.8.8:53"), ""},
		{"private IP", netip.MustParseAddrPort("192.168.1.1:443"), ""},
		{"private IP 10/8", netip.MustParseAddrPort("10.0.0.1:22"), ""},
		{"link-local metadata", netip.MustParseAddrPort("169.254.169.254:80"), ""},
		{"gateway SSH even with a rule", netip.AddrPortFrom(stacktest.Gateway, 22), ""},
		{"gateway HTTP", netip.AddrPortFrom(stacktest.Gateway, 80), ""},
		{"gateway HTTPS", netip.AddrPortFrom(stacktest.Gateway, 443), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := g.Dial(t.Context(), tt.dst)
			if tt.wantName == "" {
				if err == nil {
					c.Close()
					t.Fatalf("dial %v: connected, want refused", tt.dst)
				}
				if !strings.Contains(err.Error(), "refused") {
					t.Errorf("dial %v: got %v, want connection refused", tt.dst, err)
				}
				n.events.WaitFor(t, "connect deny to "+tt.dst.String(), func(e egress.Event) bool {
					return e.Kind == "connect" && e.Decision == "deny" && e.Dst == tt.dst.String() && e.Reason != ""
				})
				return
			}
			if err != nil {
				t.Fatalf("dial %v: %v", tt.dst, err)
			}
			defer c.Close()
			var got nsAccepted
			select {
			case got = <-n.engine.got:
			case <-time.After(5 * time.Second):
				t.Fatal("engine was not handed the connection")
			}
			tg := got.target
			if tg.Name != tt.wantName || tg.Port != tt.dst.Port() || !tg.Decision.Allow || tg.Dialled != tt.dst ||
				tg.Guest.Addr() != stacktest.GuestIP {
				t.Errorf("target: got %+v, want name %q port %d dialled %v from %v", tg, tt.wantName, tt.dst.Port(), tt.dst, stacktest.GuestIP)
			}
			msg := []byte("hello through the stack")
			if _, err := c.Write(msg); err != nil {
				t.Fatal(err)
			}
			echo := make([]byte, len(msg))
			if _, err := io.ReadFull(c, echo); err != nil || !bytes.Equal(echo, msg) {
				t.Errorf("echo: got %q, %v", echo, err)
			}
		})
	}
	select {
	case got := <-n.engine.got:
		t.Errorf("engine was handed an unexpected connection: %+v", got)
	default:
	}
}

// TestStackTCPAdmissionRaw sends SYNs a well-behaved guest stack would
// not even put on the wire (root in the VM can), and expects an RST for
// each.
func TestStackTCPAdmissionRaw(t *testing.T) {
	t.Parallel()
	n := startNSNet(t, StackConfig{}, testPolicyAllow(), nil)
	stacktest.Announce(t, n.vm)
	tests := []struct {
		name   string
		dst    netip.AddrPort
		silent bool // dropped without an RST
	}{
		{"loopback even with a rule", netip.MustParseAddrPort("127.0.0.1:443"), true},
		{"loopback other", netip.MustParseAddrPort("127.0.0.53:53"), true},
		{"another host on the guest network", netip.MustParseAddrPort("10.254.254.3:443"), false},
		{"the guest itself", netip.AddrPortFrom(stacktest.GuestIP, 443), false},
		{"this network", netip.MustParseAddrPort("0.0.0.1:443"), false},
		{"link-local", netip.MustParseAddrPort("169.254.169.254:80"), false},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := netip.AddrPortFrom(stacktest.GuestIP, uint16(20000+i))
			if _, err := n.vm.Write(stacktest.GuestIPFrame(stacktest.GuestIP, tt.dst.Addr(), protoTCP, stacktest.TCPSYN(src, tt.dst, 1000))); err != nil {
				t.Fatal(err)
			}
			var flags header.TCPFlags
			wait := 5 * time.Second
			if tt.silent {
				wait = 200 * time.Millisecond
			}
			got := stacktest.ReadFrames(t, n.vm, wait, func(f []byte) bool {
				ip := stacktest.IPv4Of(f)
				if ip == nil || ip.Protocol() != protoTCP {
					return false
				}
				h := header.TCP(ip.Payload())
				if h.DestinationPort() != src.Port() {
					return false
				}
				flags = h.Flags()
				return true
			})
			switch {
			case tt.silent && len(got) != 0:
				t.Fatalf("answer to a SYN to %v: got %d frames, want none", tt.dst, len(got))
			case !tt.silent && (len(got) == 0 || !flags.Contains(header.TCPFlagRst) || flags.Contains(header.TCPFlagSyn)):
				t.Fatalf("answer to a SYN to %v: got flags %v, want RST", tt.dst, flags)
			}
			n.events.WaitFor(t, "connect deny to "+tt.dst.String(), func(e egress.Event) bool {
				return e.Kind == "connect" && e.Decision == "deny" && e.Dst == tt.dst.String()
			})
		})
	}
	t.Run("UDP to the host loopback", func(t *testing.T) {
		dst := netip.MustParseAddrPort("127.0.0.1:53")
		src := netip.AddrPortFrom(stacktest.GuestIP, 5300)
		if _, err := n.vm.Write(stacktest.GuestIPFrame(stacktest.GuestIP, dst.Addr(), protoUDP, stacktest.UDPSegment(src, dst, []byte("q")))); err != nil {
			t.Fatal(err)
		}
		if got := stacktest.ReadFrames(t, n.vm, 200*time.Millisecond, nil); len(got) != 0 {
			t.Errorf("got %d frames in answer", len(got))
		}
		n.events.WaitFor(t, "udp deny to "+dst.String(), func(e egress.Event) bool {
			return e.Kind == "udp" && e.Decision == "deny" && e.Dst == dst.String()
		})
	})
	select {
	case got := <-n.engine.got:
		t.Errorf("engine was handed a connection: %+v", got)
	default:
	}
}

func TestStackExplicitProxy(t *testing.T) {
	n := startNSNet(t, StackConfig{}, stacktest.Policy{}, nil)
	g := n.guest(t)
	c, err := g.Dial(t.Context(), netip.AddrPortFrom(stacktest.Gateway, DefaultProxyPort))
	if err != nil {
		t.Fatalf("dial the proxy: %v", err)
	}
	defer c.Close()
	select {
	case got := <-n.engine.got:
		if !got.proxy || got.src.Addr() != stacktest.GuestIP {
			t.Errorf("got %+v, want a proxy connection from %v", got, stacktest.GuestIP)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("HandleProxyConn was not called")
	}
	if _, err := c.Write([]byte("CONNECT x:443 HTTP/1.1\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "CONN" {
		t.Errorf("echo through the proxy port: got %q, %v", buf, err)
	}
}

func TestStackUDPGoesNowhere(t *testing.T) {
	t.Parallel()
	n := startNSNet(t, StackConfig{}, testPolicyAllow(), nil)
	n.resolver.Known["api.example.com"] = true
	g := n.guest(t)
	query := stacktest.DNSQuery(t, 1, "api.example.com.", dnsmessage.TypeA)
	tests := []struct {
		name string
		dst  netip.AddrPort
	}{
		{"outside resolver", netip.MustParseAddrPort("8.8.8.8:53")},
		{"another outside resolver", netip.MustParseAddrPort("1.1.1.1:53")},
		{"DNS over QUIC port", netip.MustParseAddrPort("9.9.9.9:853")},
		{"gateway NTP", netip.AddrPortFrom(stacktest.Gateway, 123)},
		{"synthetic address", netip.MustParseAddrPort("198.18.0.1:443")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := n.stack.Stats().UDP
			if reply := g.UDPExchange(t, tt.dst, query, 300*time.Millisecond); reply != nil {
				t.Fatalf("got a reply from %v: %x", tt.dst, reply)
			}
			if got := n.stack.Stats().UDP; got <= before {
				t.Errorf("UDP drop counter: got %d, want more than %d", got, before)
			}
			n.events.WaitFor(t, "udp deny to "+tt.dst.String(), func(e egress.Event) bool {
				return e.Kind == "udp" && e.Decision == "deny" && e.Dst == tt.dst.String()
			})
		})
	}
	t.Run("the gateway still answers DNS", func(t *testing.T) {
		if _, ok := stacktest.AnswerA(g.Lookup(t, "api.example.com.", dnsmessage.TypeA)); !ok {
			t.Fatal("no answer")
		}
	})
}

func TestStackICMP(t *testing.T) {
	t.Parallel()
	n := startNSNet(t, StackConfig{}, stacktest.Policy{}, nil)
	stacktest.Announce(t, n.vm)
	tests := []struct {
		name      string
		dst       netip.Addr
		wantReply bool
	}{
		{"ping the gateway", stacktest.Gateway, false},
		{"ping the internet", netip.MustParseAddr("8.8.8.8"), false},
		{"ping a synthetic address", netip.MustParseAddr("198.18.0.1"), false},
		{"ping the host loopback", netip.MustParseAddr("127.0.0.1"), false},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := uint16(100 + i)
			if _, err := n.vm.Write(stacktest.GuestIPFrame(stacktest.GuestIP, tt.dst, protoICMP, stacktest.ICMPEcho(id))); err != nil {
				t.Fatal(err)
			}
			wait := 5 * time.Second
			if !tt.wantReply {
				wait = 300 * time.Millisecond
			}
			var reply header.IPv4
			stacktest.ReadFrames(t, n.vm, wait, func(f []byte) bool {
				ip := stacktest.IPv4Of(f)
				if ip == nil || ip.Protocol() != protoICMP {
					return false
				}
				h := header.ICMPv4(ip.Payload())
				if h.Type() == header.ICMPv4EchoReply && h.Ident() == id {
					reply = ip
					return true
				}
				return false
			})
			if got := reply != nil; got != tt.wantReply {
				t.Fatalf("echo reply: got %v, want %v", got, tt.wantReply)
			}
			if reply != nil {
				if src := fromTCPIP(reply.SourceAddress()); src != tt.dst {
					t.Errorf("reply source: got %v, want %v", src, tt.dst)
				}
				return
			}
			n.events.WaitFor(t, "icmp deny to "+tt.dst.String(), func(e egress.Event) bool {
				return e.Kind == "icmp" && e.Decision == "deny" && e.Dst == tt.dst.String()
			})
		})
	}
}

// TestStackDropsForeignFrames plays a guest that forges what it sends
// below TCP: spoofed addresses, other EtherTypes, fragments, junk.
func TestStackDropsForeignFrames(t *testing.T) {
	t.Parallel()
	n := startNSNet(t, StackConfig{}, testPolicyAllow(), nil)
	n.resolver.Known["api.example.com"] = true
	synth := netip.MustParseAddr("198.18.0.1")
	syn := func(src netip.Addr) []byte {
		return stacktest.TCPSYN(netip.AddrPortFrom(src, 40000), netip.AddrPortFrom(synth, 443), 1)
	}
	fragment := stacktest.IPv4Packet(stacktest.GuestIP, stacktest.Gateway, protoUDP,
		stacktest.UDPSegment(netip.AddrPortFrom(stacktest.GuestIP, 5000), netip.AddrPortFrom(stacktest.Gateway, 53), []byte("x")))
	binary.BigEndian.PutUint16(fragment[6:], 0x2000) // more fragments
	badIHL := stacktest.IPv4Packet(stacktest.GuestIP, stacktest.Gateway, protoTCP, syn(stacktest.GuestIP))
	badIHL[0] = 0x4f
	longTotal := stacktest.IPv4Packet(stacktest.GuestIP, stacktest.Gateway, protoTCP, syn(stacktest.GuestIP))
	binary.BigEndian.PutUint16(longTotal[2:], 4000)
	arpFor := func(sender, target netip.Addr, sha net.HardwareAddr) []byte {
		p := make([]byte, 28)
		binary.BigEndian.PutUint16(p[0:], 1)
		binary.BigEndian.PutUint16(p[2:], etherIPv4)
		p[4], p[5] = 6, 4
		binary.BigEndian.PutUint16(p[6:], 1)
		copy(p[8:14], sha)
		s, tg := sender.As4(), target.As4()
		copy(p[14:18], s[:])
		copy(p[24:28], tg[:])
		return p
	}
	tests := []struct {
		name    string
		frame   []byte
		counter func(StackStats) uint64
	}{
		{"spoofed source IP", stacktest.GuestIPFrame(netip.MustParseAddr("10.254.254.77"), synth, protoTCP, syn(netip.MustParseAddr("10.254.254.77"))),
			func(s StackStats) uint64 { return s.Spoofed }},
		{"source IP of the gateway", stacktest.GuestIPFrame(stacktest.Gateway, synth, protoTCP, syn(stacktest.Gateway)),
			func(s StackStats) uint64 { return s.Spoofed }},
		{"source IP loopback", stacktest.GuestIPFrame(netip.MustParseAddr("127.0.0.1"), synth, protoTCP, syn(netip.MustParseAddr("127.0.0.1"))),
			func(s StackStats) uint64 { return s.Spoofed }},
		{"source MAC of the gateway", stacktest.EthFrame(stacktest.GatewayHW, stacktest.GatewayHW, etherIPv4, stacktest.IPv4Packet(stacktest.GuestIP, synth, protoTCP, syn(stacktest.GuestIP))),
			func(s StackStats) uint64 { return s.Spoofed }},
		{"multicast source MAC", stacktest.EthFrame(stacktest.GatewayHW, net.HardwareAddr{1, 0, 0x5e, 0, 0, 1}, etherIPv4, stacktest.IPv4Packet(stacktest.GuestIP, synth, protoTCP, syn(stacktest.GuestIP))),
			func(s StackStats) uint64 { return s.Spoofed }},
		{"frame for another MAC", stacktest.EthFrame(net.HardwareAddr{2, 9, 9, 9, 9, 9}, stacktest.GuestHW, etherIPv4, stacktest.IPv4Packet(stacktest.GuestIP, synth, protoTCP, syn(stacktest.GuestIP))),
			func(s StackStats) uint64 { return s.NotForUs }},
		{"IPv6", stacktest.EthFrame(stacktest.GatewayHW, stacktest.GuestHW, etherIPv6, make([]byte, 60)),
			func(s StackStats) uint64 { return s.IPv6 }},
		{"IPv6 multicast", stacktest.EthFrame(net.HardwareAddr{0x33, 0x33, 0, 0, 0, 2}, stacktest.GuestHW, etherIPv6, make([]byte, 60)),
			func(s StackStats) uint64 { return s.IPv6 }},
		{"IPv4 to a multicast MAC", stacktest.EthFrame(net.HardwareAddr{1, 0, 0x5e, 0, 0, 0xfb}, stacktest.GuestHW, etherIPv4, stacktest.IPv4Packet(stacktest.GuestIP, synth, protoTCP, syn(stacktest.GuestIP))),
			func(s StackStats) uint64 { return s.Multicast }},
		{"unknown EtherType", stacktest.EthFrame(stacktest.GatewayHW, stacktest.GuestHW, 0x88b5, []byte("local experimental")),
			func(s StackStats) uint64 { return s.OtherProto }},
		{"IP fragment", stacktest.EthFrame(stacktest.GatewayHW, stacktest.GuestHW, etherIPv4, fragment),
			func(s StackStats) uint64 { return s.Fragments }},
		{"GRE", stacktest.GuestIPFrame(stacktest.GuestIP, netip.MustParseAddr("8.8.8.8"), 47, make([]byte, 8)),
			func(s StackStats) uint64 { return s.OtherProto }},
		{"bad header length", stacktest.EthFrame(stacktest.GatewayHW, stacktest.GuestHW, etherIPv4, badIHL),
			func(s StackStats) uint64 { return s.Malformed }},
		{"total length past the frame", stacktest.EthFrame(stacktest.GatewayHW, stacktest.GuestHW, etherIPv4, longTotal),
			func(s StackStats) uint64 { return s.Malformed }},
		{"runt frame", []byte{1, 2, 3},
			func(s StackStats) uint64 { return s.Malformed }},
		{"oversized datagram", stacktest.EthFrame(stacktest.GatewayHW, stacktest.GuestHW, etherIPv4, make([]byte, 70000)),
			func(s StackStats) uint64 { return s.Malformed }},
		{"ARP about another address in the guest network", stacktest.EthFrame(broadcastMAC, stacktest.GuestHW, etherARP, arpFor(stacktest.GuestIP, netip.MustParseAddr("10.254.254.9"), stacktest.GuestHW)),
			func(s StackStats) uint64 { return s.OtherProto }},
		{"ARP about a loopback address", stacktest.EthFrame(broadcastMAC, stacktest.GuestHW, etherARP, arpFor(stacktest.GuestIP, netip.MustParseAddr("127.0.0.1"), stacktest.GuestHW)),
			func(s StackStats) uint64 { return s.OtherProto }},
		{"ARP from a forged sender", stacktest.EthFrame(broadcastMAC, stacktest.GuestHW, etherARP, arpFor(netip.MustParseAddr("10.254.254.9"), stacktest.Gateway, stacktest.GuestHW)),
			func(s StackStats) uint64 { return s.Spoofed }},
		{"ARP whose sender MAC disagrees", stacktest.EthFrame(broadcastMAC, stacktest.GuestHW, etherARP, arpFor(stacktest.GuestIP, stacktest.Gateway, net.HardwareAddr{2, 1, 1, 1, 1, 1})),
			func(s StackStats) uint64 { return s.Spoofed }},
		{"IGMP report", stacktest.GuestIPFrame(stacktest.GuestIP, netip.MustParseAddr("224.0.0.22"), 2, make([]byte, 8)),
			func(s StackStats) uint64 { return s.Multicast }},
		{"ICMP port unreachable to the gateway", stacktest.GuestIPFrame(stacktest.GuestIP, stacktest.Gateway, protoICMP, append([]byte{3, 3, 0, 0}, make([]byte, 32)...)),
			func(s StackStats) uint64 { return s.ICMP }},
		{"multicast UDP", stacktest.GuestIPFrame(stacktest.GuestIP, netip.MustParseAddr("224.0.0.251"), protoUDP,
			stacktest.UDPSegment(netip.AddrPortFrom(stacktest.GuestIP, 5353), netip.MustParseAddrPort("224.0.0.251:5353"), []byte("mdns"))),
			func(s StackStats) uint64 { return s.Multicast }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := tt.counter(n.stack.Stats())
			if _, err := n.vm.Write(tt.frame); err != nil {
				if errors.Is(err, syscall.EMSGSIZE) {
					t.Skip("the socket refuses datagrams this large")
				}
				t.Fatal(err)
			}
			deadline := time.Now().Add(5 * time.Second)
			for tt.counter(n.stack.Stats()) == before {
				if time.Now().After(deadline) {
					t.Fatalf("frame was not counted as dropped: %+v", n.stack.Stats())
				}
				time.Sleep(2 * time.Millisecond)
			}
			// Nothing answers a dropped frame.
			if got := stacktest.ReadFrames(t, n.vm, 50*time.Millisecond, nil); len(got) != 0 {
				t.Errorf("got %d frames in answer to a dropped frame", len(got))
			}
		})
	}
	select {
	case got := <-n.engine.got:
		t.Errorf("engine was handed a connection from a forged frame: %+v", got)
	default:
	}
	// Local chatter and errors are counted, not alerted on.
	for _, e := range n.events.All() {
		if strings.HasPrefix(e.Dst, "224.") || e.Dst == stacktest.Gateway.String() {
			t.Errorf("event for local chatter: %+v", e)
		}
	}
	t.Run("ARP reply for the gateway only", func(t *testing.T) {
		// A probe for the guest's own address must not be answered by the
		// gateway (a DHCP client would decline its lease).
		probe := stacktest.EthFrame(broadcastMAC, stacktest.GuestHW, etherARP, arpFor(netip.IPv4Unspecified(), stacktest.GuestIP, stacktest.GuestHW))
		if _, err := n.vm.Write(probe); err != nil {
			t.Fatal(err)
		}
		if got := stacktest.ReadFrames(t, n.vm, 100*time.Millisecond, nil); len(got) != 0 {
			t.Errorf("got %d frames in answer to an ARP probe for the guest's address", len(got))
		}
		ask := stacktest.EthFrame(broadcastMAC, stacktest.GuestHW, etherARP, arpFor(stacktest.GuestIP, stacktest.Gateway, stacktest.GuestHW))
		if _, err := n.vm.Write(ask); err != nil {
			t.Fatal(err)
		}
		got := stacktest.ReadFrames(t, n.vm, 5*time.Second, func(f []byte) bool {
			return binary.BigEndian.Uint16(f[12:]) == etherARP
		})
		if len(got) == 0 {
			t.Fatal("the gateway did not answer ARP for itself")
		}
		f := got[len(got)-1][ethHeaderLen:]
		if !bytes.Equal(f[8:14], stacktest.GatewayHW) || netip.AddrFrom4([4]byte(f[14:18])) != stacktest.Gateway {
			t.Errorf("ARP reply: got sender %x %v", f[8:14], f[14:18])
		}
		// An outside address is answered too (an on-link default route
		// still leads to the gateway).
		outside := netip.MustParseAddr("198.18.0.1")
		ask = stacktest.EthFrame(broadcastMAC, stacktest.GuestHW, etherARP, arpFor(stacktest.GuestIP, outside, stacktest.GuestHW))
		if _, err := n.vm.Write(ask); err != nil {
			t.Fatal(err)
		}
		got = stacktest.ReadFrames(t, n.vm, 5*time.Second, func(f []byte) bool {
			return binary.BigEndian.Uint16(f[12:]) == etherARP
		})
		if len(got) == 0 {
			t.Fatal("the gateway did not answer ARP for an outside address")
		}
		f = got[len(got)-1][ethHeaderLen:]
		if !bytes.Equal(f[8:14], stacktest.GatewayHW) || netip.AddrFrom4([4]byte(f[14:18])) != outside {
			t.Errorf("ARP reply: got sender %x %v", f[8:14], f[14:18])
		}
	})
}

func TestStackSurvivesGarbage(t *testing.T) {
	n := startNSNet(t, StackConfig{}, testPolicyAllow(), nil)
	n.resolver.Known["api.example.com"] = true
	rng := rand.New(rand.NewPCG(1, 2))
	var frames [][]byte
	for i := range 2000 {
		size := rng.IntN(200)
		b := make([]byte, size)
		for j := range b {
			b[j] = byte(rng.Uint32())
		}
		switch i % 4 {
		case 0: // random bytes behind a valid Ethernet header to the gateway
			frames = append(frames, stacktest.EthFrame(stacktest.GatewayHW, stacktest.GuestHW, etherIPv4, b))
		case 1: // an IPv4 header from the guest with random contents
			p := stacktest.IPv4Packet(stacktest.GuestIP, stacktest.Gateway, uint8(rng.IntN(256)), b)
			p[rng.IntN(20)] ^= byte(1 << rng.IntN(8))
			frames = append(frames, stacktest.EthFrame(stacktest.GatewayHW, stacktest.GuestHW, etherIPv4, p))
		case 2: // a random DNS payload to the gateway
			frames = append(frames, stacktest.GuestIPFrame(stacktest.GuestIP, stacktest.Gateway, protoUDP,
				stacktest.UDPSegment(netip.AddrPortFrom(stacktest.GuestIP, 3000), netip.AddrPortFrom(stacktest.Gateway, 53), b)))
		default: // random TCP segment to a synthetic address
			seg := stacktest.TCPSYN(netip.AddrPortFrom(stacktest.GuestIP, 3001), netip.MustParseAddrPort("198.18.0.1:443"), rng.Uint32())
			seg = append(seg, b...)
			seg[13] = byte(rng.Uint32())
			frames = append(frames, stacktest.GuestIPFrame(stacktest.GuestIP, netip.MustParseAddr("198.18.0.1"), protoTCP, seg))
		}
	}
	stop := stacktest.Drain(n.vm) // answers: RSTs, FORMERR
	for _, f := range frames {
		if _, err := n.vm.Write(f); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for n.stack.Stats().FramesIn < uint64(len(frames)) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	// The network still works. The server drops queries while 64 are in
	// flight (answering the garbage can take a moment), as any resolver
	// may: like a real client, ask up to three times.
	g := n.guest(t)
	var reply []byte
	for try := 0; try < 3 && reply == nil; try++ {
		reply = g.UDPExchange(t, netip.AddrPortFrom(stacktest.Gateway, 53), stacktest.DNSQuery(t, 0x1234, "api.example.com.", dnsmessage.TypeA), 3*time.Second)
	}
	var m dnsmessage.Message
	if reply == nil || m.Unpack(reply) != nil {
		t.Fatal("DNS no longer answers after the garbage")
	}
	if _, ok := stacktest.AnswerA(m); !ok {
		t.Fatal("DNS no longer answers after the garbage")
	}
}

func TestStackSYNFlood(t *testing.T) {
	cfg := StackConfig{MaxInFlight: 64}
	n := startNSNet(t, cfg, testPolicyAllow(), nil)
	api, _ := n.stack.dns.pool.addr("api.example.com") // as if the guest had asked
	stop := stacktest.Drain(n.vm)
	defer stop()
	base := runtime.NumGoroutine()
	start := time.Now()

	// Forged SYNs, never followed by an ACK: half the flood goes to an
	// allowed name (handshakes left half-open), half to a denied address
	// (answered with RST).
	const flood = 5000
	for i := range flood {
		dst := netip.AddrPortFrom(api, 443)
		if i%2 == 1 {
			dst = netip.MustParseAddrPort("93.184.216.34:443")
		}
		src := netip.AddrPortFrom(stacktest.GuestIP, uint16(10000+i))
		if _, err := n.vm.Write(stacktest.GuestIPFrame(stacktest.GuestIP, dst.Addr(), protoTCP, stacktest.TCPSYN(src, dst, uint32(i)))); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for n.stack.Stats().FramesIn < flood && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	// Each half-open handshake holds one goroutine; the forwarder holds at
	// most MaxInFlight of them, whatever the flood's size. Short-lived
	// goroutines (RSTs for the denied half) may still be finishing on a
	// loaded machine, so wait for the count to settle within the bound;
	// half-open handshakes beyond it would be held far longer than this.
	limit := cfg.MaxInFlight + 32
	settle := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine()-base > limit && time.Now().Before(settle) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := runtime.NumGoroutine() - base; got > limit {
		t.Errorf("goroutines after a %d-SYN flood: %d more than before, want at most %d", flood, got, limit)
	}
	if drops := n.stack.st.Stats().TCP.ForwardMaxInFlightDrop.Value(); drops == 0 {
		t.Errorf("the flood never reached MaxInFlight (%d): the bound was not exercised", cfg.MaxInFlight)
	}
	select {
	case got := <-n.engine.got:
		t.Errorf("engine was handed a half-open connection: %+v", got)
	default:
	}
	// Refusals are logged, but rate-limited: at most the burst plus what
	// the bucket refilled while the flood lasted (and a summary line).
	// The bound is measured to the moment of counting: the bucket goes on
	// refilling while a loaded machine is still working through the flood.
	n.events.WaitFor(t, "connect deny", func(e egress.Event) bool { return e.Kind == "connect" && e.Decision == "deny" })
	elapsed := time.Since(start)
	denies := 0
	for _, e := range n.events.All() {
		if e.Kind == "connect" && e.Decision == "deny" {
			denies++
		}
	}
	if limit := eventBurst + int(elapsed.Seconds()*eventRate) + 2; denies == 0 || denies > limit {
		t.Errorf("connect deny events after the flood: got %d, want between 1 and %d", denies, limit)
	}
}

func TestStackConnLimit(t *testing.T) {
	eng := newNSEngine()
	eng.hold = make(chan struct{})
	n := startNSNet(t, StackConfig{MaxConns: 2}, testPolicyAllow(), eng)
	defer close(eng.hold)
	n.resolver.Known["api.example.com"] = true
	g := n.guest(t)
	api, _ := stacktest.AnswerA(g.Lookup(t, "api.example.com.", dnsmessage.TypeA))
	dst := netip.AddrPortFrom(api, 443)
	for i := range 2 {
		c, err := g.Dial(t.Context(), dst)
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		defer c.Close()
		<-eng.got
	}
	if c, err := g.Dial(t.Context(), dst); err == nil {
		c.Close()
		t.Fatal("third connection admitted over MaxConns 2")
	}
	n.events.WaitFor(t, "too many connections", func(e egress.Event) bool {
		return e.Kind == "connect" && strings.Contains(e.Reason, "too many open connections")
	})
	if got := n.stack.Stats().ConnsOpen; got != 2 {
		t.Errorf("ConnsOpen: got %d, want 2", got)
	}
}

// TestStackWithPolicy runs the stack with the real egress policy.
func TestStackWithPolicy(t *testing.T) {
	rules, err := egress.ParseRules(strings.NewReader("*.example.com\n!blocked.example.com\n"), "test")
	if err != nil {
		t.Fatal(err)
	}
	n := startNSNet(t, StackConfig{}, egress.NewPolicy(rules), nil)
	n.resolver.Known["a.example.com"] = true
	g := n.guest(t)
	m := g.Lookup(t, "a.example.com.", dnsmessage.TypeA)
	a, ok := stacktest.AnswerA(m)
	if !ok {
		t.Fatalf("a.example.com: got %v, want an A record", m.RCode)
	}
	if m := g.Lookup(t, "blocked.example.com.", dnsmessage.TypeA); m.RCode != dnsmessage.RCodeNameError {
		t.Errorf("blocked.example.com: got %v, want NXDOMAIN", m.RCode)
	}
	if slices.Contains(n.resolver.Calls(), "blocked.example.com") {
		t.Errorf("the resolver was asked about a denied name")
	}
	c, err := g.Dial(t.Context(), netip.AddrPortFrom(a, 443))
	if err != nil {
		t.Fatalf("dial a.example.com:443: %v", err)
	}
	c.Close()
	if got := <-n.engine.got; got.target.Name != "a.example.com" || got.target.Decision.Rule != "*.example.com" {
		t.Errorf("target: got %+v", got.target)
	}
	if c, err := g.Dial(t.Context(), netip.AddrPortFrom(a, 8080)); err == nil {
		c.Close()
		t.Errorf("a.example.com:8080 admitted")
	}
}

// FuzzStackFrames feeds arbitrary frames through the frame filter into
// the gateway's stack: nothing may panic, whatever the guest sends.
func FuzzStackFrames(f *testing.F) {
	synth := netip.MustParseAddr("198.18.0.1")
	f.Add(stacktest.GuestIPFrame(stacktest.GuestIP, synth, protoTCP, stacktest.TCPSYN(netip.AddrPortFrom(stacktest.GuestIP, 1), netip.AddrPortFrom(synth, 443), 1)))
	f.Add(stacktest.GuestIPFrame(stacktest.GuestIP, stacktest.Gateway, protoUDP, stacktest.UDPSegment(netip.AddrPortFrom(stacktest.GuestIP, 1),
		netip.AddrPortFrom(stacktest.Gateway, 53), stacktest.DNSQuery(f, 1, "api.example.com.", dnsmessage.TypeA))))
	f.Add(stacktest.GuestIPFrame(stacktest.GuestIP, stacktest.Gateway, protoICMP, stacktest.ICMPEcho(1)))
	f.Add(stacktest.EthFrame(broadcastMAC, stacktest.GuestHW, etherARP, make([]byte, 28)))
	s, err := NewStack(StackConfig{}, newNSEngine(), testPolicyAllow(), nil, nil)
	if err != nil {
		f.Fatal(err)
	}
	defer s.Close()
	f.Fuzz(func(t *testing.T, frame []byte) {
		if len(frame) > s.link.frameSize() {
			return
		}
		if s.checkFrame(frame) {
			s.link.deliver(frame)
		}
	})
}

func TestStackLeavesNoGoroutines(t *testing.T) {
	before := runtime.NumGoroutine()
	func() {
		s, err := NewStack(StackConfig{}, newNSEngine(), testPolicyAllow(), nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		host, vmFile, err := SocketPair()
		if err != nil {
			t.Fatal(err)
		}
		defer host.Close()
		defer vmFile.Close()
		done := make(chan error, 1)
		go func() { done <- s.Serve(t.Context(), host) }()
		vm, err := net.FileConn(vmFile)
		if err != nil {
			t.Fatal(err)
		}
		defer vm.Close()
		// Some traffic: a DNS query and a SYN that gets admitted.
		stacktest.Announce(t, vm)
		q := stacktest.UDPSegment(netip.AddrPortFrom(stacktest.GuestIP, 4000), netip.AddrPortFrom(stacktest.Gateway, 53),
			stacktest.DNSQuery(t, 1, "api.example.com.", dnsmessage.TypeA))
		vm.Write(stacktest.GuestIPFrame(stacktest.GuestIP, stacktest.Gateway, protoUDP, q))
		stacktest.ReadFrames(t, vm, 2*time.Second, func(f []byte) bool { return stacktest.IPv4Of(f) != nil })
		// A half-open handshake is in progress when the stack closes.
		dst := netip.MustParseAddrPort("198.18.0.1:443")
		vm.Write(stacktest.GuestIPFrame(stacktest.GuestIP, dst.Addr(), protoTCP, stacktest.TCPSYN(netip.AddrPortFrom(stacktest.GuestIP, 4001), dst, 1)))
		synAck := stacktest.ReadFrames(t, vm, 2*time.Second, func(f []byte) bool {
			ip := stacktest.IPv4Of(f)
			return ip != nil && ip.Protocol() == protoTCP && header.TCP(ip.Payload()).Flags().Contains(header.TCPFlagSyn|header.TCPFlagAck)
		})
		if len(synAck) == 0 {
			t.Fatal("no SYN-ACK")
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatalf("Serve: %v", err)
		}
	}()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if after := runtime.NumGoroutine(); after > before {
		buf := make([]byte, 1<<20)
		t.Errorf("goroutines: %d before, %d after Close\n%s", before, after, buf[:runtime.Stack(buf, true)])
	}
}
