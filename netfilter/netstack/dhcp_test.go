package netstack

import (
	"github.com/vibedom/vibedom/netfilter/internal/stacktest"

	"bytes"
	"net"
	"net/netip"
	"testing"
	"time"
)

func testDHCPServer(mtu int) *dhcpServer {
	return &dhcpServer{
		gateway: stacktest.Gateway, guest: stacktest.GuestIP, mask: net.CIDRMask(24, 32),
		mtu: mtu, lease: time.Hour, log: stacktest.DiscardLogger(),
	}
}

// dhcpMsg builds a client message with the given options (already
// encoded), ciaddr and chaddr.
func dhcpMsg(ciaddr netip.Addr, opts ...byte) []byte {
	b := make([]byte, dhcpFixedLen)
	b[0], b[1], b[2] = 1, 1, 6
	copy(b[4:8], []byte{1, 2, 3, 4})
	if ciaddr.IsValid() {
		a := ciaddr.As4()
		copy(b[12:16], a[:])
	}
	copy(b[28:34], stacktest.GuestHW)
	b = append(b, dhcpMagic...)
	return append(b, opts...)
}

// replyOptions parses the options of a server reply.
func replyOptions(t *testing.T, r []byte) map[byte][]byte {
	t.Helper()
	if len(r) < dhcpMinReply || r[0] != 2 || !bytes.Equal(r[dhcpFixedLen:dhcpFixedLen+4], dhcpMagic) {
		t.Fatalf("not a DHCP reply: %x", r)
	}
	out := map[byte][]byte{}
	b := r[dhcpFixedLen+4:]
	for i := 0; i < len(b) && b[i] != optEnd; {
		if b[i] == optPad {
			i++
			continue
		}
		out[b[i]] = b[i+2 : i+2+int(b[i+1])]
		i += 2 + int(b[i+1])
	}
	return out
}

func TestDHCPReply(t *testing.T) {
	other := stacktest.Gateway.As4()
	other[3] = 99
	guest := stacktest.GuestIP.As4()
	tests := []struct {
		name     string
		mtu      int
		msg      []byte
		wantType byte // 0: no reply
		wantYI   netip.Addr
		wantOpt  map[byte]bool // options that must (true) or must not (false) be present
	}{
		{name: "discover", mtu: 1500, msg: dhcpMsg(netip.Addr{}, optMsgType, 1, dhcpDiscover, optEnd),
			wantType: dhcpOffer, wantYI: stacktest.GuestIP, wantOpt: map[byte]bool{optLeaseTime: true, optMTU: false}},
		{name: "discover with a large MTU", mtu: 9000, msg: dhcpMsg(netip.Addr{}, optMsgType, 1, dhcpDiscover, optEnd),
			wantType: dhcpOffer, wantYI: stacktest.GuestIP, wantOpt: map[byte]bool{optMTU: true}},
		{name: "renewal by ciaddr", mtu: 1500, msg: dhcpMsg(stacktest.GuestIP, optMsgType, 1, dhcpRequest, optEnd),
			wantType: dhcpAck, wantYI: stacktest.GuestIP},
		{name: "request with our server id", mtu: 1500, msg: dhcpMsg(netip.Addr{}, optMsgType, 1, dhcpRequest,
			optRequestedIP, 4, guest[0], guest[1], guest[2], guest[3], optServerID, 4, 10, 254, 254, 1, optEnd),
			wantType: dhcpAck, wantYI: stacktest.GuestIP},
		{name: "request for another server", mtu: 1500, msg: dhcpMsg(netip.Addr{}, optMsgType, 1, dhcpRequest,
			optServerID, 4, other[0], other[1], other[2], other[3], optEnd)},
		{name: "request for another address", mtu: 1500, msg: dhcpMsg(netip.Addr{}, optMsgType, 1, dhcpRequest,
			optRequestedIP, 4, 10, 254, 254, 50, optEnd), wantType: dhcpNak, wantYI: netip.IPv4Unspecified(),
			wantOpt: map[byte]bool{optRouter: false, optLeaseTime: false}},
		{name: "inform", mtu: 1500, msg: dhcpMsg(stacktest.GuestIP, optMsgType, 1, dhcpInform, optEnd),
			wantType: dhcpAck, wantYI: netip.IPv4Unspecified(), wantOpt: map[byte]bool{optLeaseTime: false, optDNS: true}},
		{name: "release", mtu: 1500, msg: dhcpMsg(stacktest.GuestIP, optMsgType, 1, dhcpRelease, optEnd)},
		{name: "no message type", mtu: 1500, msg: dhcpMsg(netip.Addr{}, optEnd)},
		{name: "option past the end", mtu: 1500, msg: dhcpMsg(netip.Addr{}, optMsgType, 1, dhcpDiscover, 12, 200, 'x')},
		{name: "option length byte missing", mtu: 1500, msg: dhcpMsg(netip.Addr{}, optMsgType, 1, dhcpDiscover, 12)},
		{name: "truncated", mtu: 1500, msg: dhcpMsg(netip.Addr{})[:100]},
		{name: "a reply, not a request", mtu: 1500, msg: func() []byte {
			m := dhcpMsg(netip.Addr{}, optMsgType, 1, dhcpDiscover, optEnd)
			m[0] = 2
			return m
		}()},
		{name: "bad magic", mtu: 1500, msg: func() []byte {
			m := dhcpMsg(netip.Addr{}, optMsgType, 1, dhcpDiscover, optEnd)
			m[dhcpFixedLen] = 0
			return m
		}()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := testDHCPServer(tt.mtu).reply(tt.msg)
			if tt.wantType == 0 {
				if r != nil {
					t.Fatalf("got a reply %x, want none", r)
				}
				return
			}
			if r == nil {
				t.Fatal("no reply")
			}
			opts := replyOptions(t, r)
			if got := opts[optMsgType]; len(got) != 1 || got[0] != tt.wantType {
				t.Errorf("type: got %v, want %d", got, tt.wantType)
			}
			if got := netip.AddrFrom4([4]byte(r[16:20])); got != tt.wantYI {
				t.Errorf("yiaddr: got %v, want %v", got, tt.wantYI)
			}
			if !bytes.Equal(r[4:8], tt.msg[4:8]) || !bytes.Equal(r[28:34], stacktest.GuestHW) {
				t.Errorf("xid or chaddr not echoed: %x %x", r[4:8], r[28:34])
			}
			for code, want := range tt.wantOpt {
				if _, got := opts[code]; got != want {
					t.Errorf("option %d present: got %v, want %v", code, got, want)
				}
			}
		})
	}
}

// FuzzDHCPReply: any message either gets no reply or a well-formed one
// that leases nothing but the guest address.
func FuzzDHCPReply(f *testing.F) {
	f.Add(dhcpMsg(netip.Addr{}, optMsgType, 1, dhcpDiscover, optEnd))
	f.Add(dhcpMsg(stacktest.GuestIP, optMsgType, 1, dhcpRequest, optEnd))
	f.Add(dhcpMsg(netip.Addr{}, optMsgType, 1, dhcpDiscover, 12, 255))
	d := testDHCPServer(1500)
	f.Fuzz(func(t *testing.T, msg []byte) {
		r := d.reply(msg)
		if r == nil {
			return
		}
		opts := replyOptions(t, r)
		yi := netip.AddrFrom4([4]byte(r[16:20]))
		if yi != stacktest.GuestIP && yi != netip.IPv4Unspecified() {
			t.Fatalf("leased %v", yi)
		}
		if len(opts[optMsgType]) != 1 {
			t.Fatalf("reply without a message type")
		}
	})
}
