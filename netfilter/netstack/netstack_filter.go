package netstack

import (
	"github.com/vibedom/vibedom/netfilter/egress"

	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
)

// EtherTypes and IP protocol numbers the filter knows.
const (
	etherIPv4 = 0x0800
	etherARP  = 0x0806
	etherIPv6 = 0x86dd

	protoICMP = 1
	protoTCP  = 6
	protoUDP  = 17

	icmpEchoRequest = 8
)

var broadcastMAC = []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// checkFrame decides whether a frame from the guest may enter the stack.
// It lets through only what the stack serves, so gVisor never sees the
// rest (in promiscuous and spoofing mode it would, for instance, answer a
// ping to any address or an ARP query for any address):
//
//   - Ethernet: the source must be a unicast address other than the
//     gateway's (and the configured guest MAC, if any); the destination
//     the gateway or broadcast.
//   - ARP: IPv4 over Ethernet, sent from the guest address (or 0.0.0.0,
//     an address probe) by the frame's own source MAC, asking about the
//     gateway or an address outside the guest network (see
//     arpAnswerable), or answering the gateway.
//   - IPv4: a well-formed header, not a fragment, from the guest address
//     (0.0.0.0 only for DHCP); then TCP to any address (the forwarder
//     decides; loopback destinations are dropped), UDP only to the
//     gateway's DNS and DHCP ports (DHCP also to 255.255.255.255), no
//     ICMP at all (not even an echo request to the gateway).
//
// Everything else is dropped and counted; unicast UDP and ICMP and
// unknown IP protocols are also recorded as denied events (rate-limited).
// IPv6 and other EtherTypes are only counted: guests emit them on their
// own (router solicitations, multicast listener reports).
func (s *Stack) checkFrame(f []byte) bool {
	st := &s.stats
	if len(f) < ethHeaderLen {
		st.malformed.Add(1)
		return false
	}
	dstMAC, srcMAC := f[0:6], f[6:12]
	if srcMAC[0]&1 != 0 || bytes.Equal(srcMAC, s.cfg.GatewayMAC) || allZero(srcMAC) ||
		(s.cfg.GuestMAC != nil && !bytes.Equal(srcMAC, s.cfg.GuestMAC)) {
		st.spoofed.Add(1)
		return false
	}
	typ := binary.BigEndian.Uint16(f[12:14])
	if !bytes.Equal(dstMAC, s.cfg.GatewayMAC) && !bytes.Equal(dstMAC, broadcastMAC) {
		switch {
		case typ == etherIPv6:
			st.ipv6.Add(1)
		case dstMAC[0]&1 != 0:
			st.multicast.Add(1)
		default:
			st.notForUs.Add(1)
		}
		return false
	}
	p := f[ethHeaderLen:]
	switch typ {
	case etherARP:
		return s.checkARP(p, srcMAC)
	case etherIPv4:
		return s.checkIPv4(p)
	case etherIPv6:
		st.ipv6.Add(1)
	default:
		st.otherProto.Add(1)
	}
	return false
}

func (s *Stack) checkARP(p, srcMAC []byte) bool {
	st := &s.stats
	// htype 1 (Ethernet), ptype IPv4, hlen 6, plen 4, op, sha, spa, tha, tpa.
	if len(p) < 28 || binary.BigEndian.Uint16(p[0:]) != 1 || binary.BigEndian.Uint16(p[2:]) != etherIPv4 ||
		p[4] != 6 || p[5] != 4 {
		st.malformed.Add(1)
		return false
	}
	op := binary.BigEndian.Uint16(p[6:])
	sha, spa, tpa := p[8:14], [4]byte(p[14:18]), [4]byte(p[24:28])
	if !bytes.Equal(sha, srcMAC) || (spa != s.guestIP && spa != [4]byte{}) {
		st.spoofed.Add(1)
		return false
	}
	switch {
	case op == 1 && s.arpAnswerable(tpa): // who has the gateway (or, on-link, an outside address)?
		return true
	case op == 2 && spa == s.guestIP && tpa == s.gwIP: // the guest answers the gateway
		return true
	}
	st.otherProto.Add(1)
	return false
}

// arpAnswerable reports whether the gateway answers ARP queries for a: its
// own address, and any unicast address outside the guest network (proxy
// ARP), so that a guest whose root replaced the default route with an
// on-link one still reaches what the policy allows. Never for addresses
// in the guest network: a DHCP client's probe for its own address must
// go unanswered.
func (s *Stack) arpAnswerable(a [4]byte) bool {
	if a == s.gwIP {
		return true
	}
	ip := netip.AddrFrom4(a)
	if s.cfg.Subnet.Contains(ip) || a[0] == 0 || a == [4]byte{255, 255, 255, 255} {
		return false
	}
	return !ip.IsLoopback() && !ip.IsMulticast()
}

func (s *Stack) checkIPv4(p []byte) bool {
	st := &s.stats
	if len(p) < 20 || p[0]>>4 != 4 {
		st.malformed.Add(1)
		return false
	}
	ihl := int(p[0]&0xf) * 4
	total := int(binary.BigEndian.Uint16(p[2:]))
	if ihl < 20 || total < ihl || total > len(p) {
		st.malformed.Add(1)
		return false
	}
	if binary.BigEndian.Uint16(p[6:])&0x3fff != 0 { // MF or an offset
		st.fragments.Add(1)
		return false
	}
	proto := p[9]
	src, dst := [4]byte(p[12:16]), [4]byte(p[16:20])
	l4 := p[ihl:total]
	srcAddr, dstAddr := netip.AddrFrom4(src), netip.AddrFrom4(dst)
	var srcPort, dstPort uint16
	if (proto == protoTCP || proto == protoUDP) && len(l4) >= 4 {
		srcPort, dstPort = binary.BigEndian.Uint16(l4[0:]), binary.BigEndian.Uint16(l4[2:])
	}
	isDHCP := proto == protoUDP && len(l4) >= 8 && srcPort == dhcpClientPort && dstPort == dhcpServerPort &&
		(dst == s.gwIP || dst == [4]byte{255, 255, 255, 255})

	if src != s.guestIP && !(src == [4]byte{} && isDHCP) {
		st.spoofed.Add(1)
		return false
	}
	if isDHCP {
		return true
	}
	if dst == [4]byte{255, 255, 255, 255} || dst == s.bcastIP || dstAddr.IsMulticast() {
		st.multicast.Add(1) // local chatter (mDNS, IGMP, SSDP …): dropped, not logged
		return false
	}
	switch proto {
	case protoTCP:
		if len(l4) < 20 {
			st.malformed.Add(1)
			return false
		}
		if dstAddr.IsLoopback() {
			// gVisor drops these silently (martians); say so in the log.
			st.martians.Add(1)
			s.refused(egress.Event{Kind: "connect", Port: dstPort, Src: netip.AddrPortFrom(srcAddr, srcPort).String(),
				Dst: netip.AddrPortFrom(dstAddr, dstPort).String(), Decision: "deny",
				Reason: dstAddr.String() + " is never reachable from the guest"})
			return false
		}
		return true // the TCP forwarder decides
	case protoUDP:
		if len(l4) < 8 {
			st.malformed.Add(1)
			return false
		}
		if dst == s.gwIP && dstPort == 53 {
			return true
		}
		st.udp.Add(1)
		s.refused(egress.Event{Kind: "udp", Port: dstPort, Src: netip.AddrPortFrom(srcAddr, srcPort).String(),
			Dst: netip.AddrPortFrom(dstAddr, dstPort).String(), Decision: "deny",
			Reason: "UDP goes nowhere but to the gateway's DNS server (port 53)"})
		return false
	case protoICMP:
		if len(l4) < 8 {
			st.malformed.Add(1)
			return false
		}
		st.icmp.Add(1)
		if dst == s.gwIP && l4[0] != icmpEchoRequest {
			return false // errors and the like about the gateway's own traffic: not worth an alert
		}
		s.refused(egress.Event{Kind: "icmp", Src: srcAddr.String(), Dst: dstAddr.String(), Decision: "deny",
			Reason: fmt.Sprintf("ICMP type %d dropped: ICMP goes nowhere, not even to the gateway", l4[0])})
		return false
	}
	st.otherProto.Add(1)
	s.refused(egress.Event{Kind: "ip", Src: srcAddr.String(), Dst: dstAddr.String(), Decision: "deny",
		Reason: fmt.Sprintf("IP protocol %d is not carried (only TCP and DNS over UDP)", proto)})
	return false
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
