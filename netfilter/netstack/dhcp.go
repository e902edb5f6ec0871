package netstack

import (
	"bytes"
	"encoding/binary"
	"log/slog"
	"net"
	"net/netip"
	"time"
)

// DHCP (RFC 2131) wire constants.
const (
	dhcpServerPort = 67
	dhcpClientPort = 68
	dhcpFixedLen   = 236 // BOOTP fixed part, before the magic cookie
	dhcpMinReply   = 300 // BOOTP minimum message size

	dhcpDiscover = 1
	dhcpOffer    = 2
	dhcpRequest  = 3
	dhcpDecline  = 4
	dhcpAck      = 5
	dhcpNak      = 6
	dhcpRelease  = 7
	dhcpInform   = 8

	optPad         = 0
	optSubnetMask  = 1
	optRouter      = 3
	optDNS         = 6
	optMTU         = 26
	optRequestedIP = 50
	optLeaseTime   = 51
	optMsgType     = 53
	optServerID    = 54
	optRenewalT1   = 58
	optRebindT2    = 59
	optEnd         = 255
)

var dhcpMagic = []byte{99, 130, 83, 99}

// dhcpServer leases the one guest address. It offers nothing but the
// address, its mask, the router and DNS server (both the gateway), the
// lease time and, when it is not 1500, the MTU.
type dhcpServer struct {
	gateway, guest netip.Addr
	mask           net.IPMask
	mtu            int
	lease          time.Duration
	guestMAC       net.HardwareAddr // nil: answer any client
	log            *slog.Logger
}

// dhcpRequestMsg is what the server reads from a client message.
type dhcpRequestMsg struct {
	msgType   byte
	requested netip.Addr
	serverID  netip.Addr
}

// reply returns the answer to the client message req, or nil.
func (d *dhcpServer) reply(req []byte) []byte {
	if len(req) < dhcpFixedLen+len(dhcpMagic) || req[0] != 1 || req[1] != 1 || req[2] != 6 ||
		!bytes.Equal(req[dhcpFixedLen:dhcpFixedLen+4], dhcpMagic) {
		return nil
	}
	chaddr := net.HardwareAddr(req[28:34])
	if d.guestMAC != nil && !bytes.Equal(chaddr, d.guestMAC) {
		d.log.Debug("dhcp: ignoring a client that is not the guest", "mac", chaddr.String())
		return nil
	}
	m, ok := parseDHCPOptions(req[dhcpFixedLen+4:])
	if !ok {
		return nil
	}
	ciaddr := netip.AddrFrom4([4]byte(req[12:16]))
	switch m.msgType {
	case dhcpDiscover:
		return d.build(req, dhcpOffer, d.guest)
	case dhcpRequest:
		if m.serverID.IsValid() && m.serverID != d.gateway {
			return nil // the client chose another server
		}
		want := m.requested
		if !want.IsValid() {
			want = ciaddr
		}
		if want != d.guest {
			d.log.Debug("dhcp: refusing a request for an address that is not the guest's", "requested", want.String())
			return d.build(req, dhcpNak, netip.Addr{})
		}
		return d.build(req, dhcpAck, d.guest)
	case dhcpInform:
		return d.build(req, dhcpAck, netip.Addr{})
	case dhcpRelease, dhcpDecline:
		d.log.Debug("dhcp: client released or declined its address", "type", m.msgType)
	}
	return nil
}

// parseDHCPOptions reads the options the server cares about. ok is false
// when an option runs past the end of the message or there is no message
// type.
func parseDHCPOptions(b []byte) (m dhcpRequestMsg, ok bool) {
	for i := 0; i < len(b); {
		code := b[i]
		if code == optPad {
			i++
			continue
		}
		if code == optEnd {
			break
		}
		if i+1 >= len(b) || i+2+int(b[i+1]) > len(b) {
			return m, false
		}
		v := b[i+2 : i+2+int(b[i+1])]
		switch {
		case code == optMsgType && len(v) == 1:
			m.msgType = v[0]
		case code == optRequestedIP && len(v) == 4:
			m.requested = netip.AddrFrom4([4]byte(v))
		case code == optServerID && len(v) == 4:
			m.serverID = netip.AddrFrom4([4]byte(v))
		}
		i += 2 + len(v)
	}
	return m, m.msgType != 0
}

// build makes a reply of type typ to req, leasing yiaddr when valid.
func (d *dhcpServer) build(req []byte, typ byte, yiaddr netip.Addr) []byte {
	b := make([]byte, dhcpFixedLen, dhcpMinReply+64)
	b[0], b[1], b[2] = 2, 1, 6 // BOOTREPLY, Ethernet, 6-byte MAC
	copy(b[4:8], req[4:8])     // xid
	copy(b[10:12], req[10:12]) // flags (broadcast bit)
	copy(b[24:28], req[24:28]) // giaddr
	copy(b[28:44], req[28:44]) // chaddr
	if typ != dhcpNak {
		copy(b[12:16], req[12:16]) // ciaddr
	}
	if yiaddr.IsValid() {
		ip := yiaddr.As4()
		copy(b[16:20], ip[:])
	}
	b = append(b, dhcpMagic...)
	gw := d.gateway.As4()
	b = append(b, optMsgType, 1, typ)
	b = append(b, optServerID, 4, gw[0], gw[1], gw[2], gw[3])
	if typ != dhcpNak {
		if yiaddr.IsValid() {
			secs := uint32(d.lease / time.Second)
			b = append(b, optLeaseTime, 4)
			b = binary.BigEndian.AppendUint32(b, secs)
			b = append(b, optRenewalT1, 4)
			b = binary.BigEndian.AppendUint32(b, secs/2)
			b = append(b, optRebindT2, 4)
			b = binary.BigEndian.AppendUint32(b, secs/8*7)
		}
		b = append(b, optSubnetMask, 4)
		b = append(b, d.mask...)
		b = append(b, optRouter, 4, gw[0], gw[1], gw[2], gw[3])
		b = append(b, optDNS, 4, gw[0], gw[1], gw[2], gw[3])
		if d.mtu != 1500 {
			b = append(b, optMTU, 2)
			b = binary.BigEndian.AppendUint16(b, uint16(d.mtu))
		}
	}
	b = append(b, optEnd)
	for len(b) < dhcpMinReply {
		b = append(b, optPad)
	}
	return b
}

// serve answers client messages on pc until it is closed. Replies are
// broadcast: the client has no address yet, and the only other party on
// the link is the gateway itself.
func (d *dhcpServer) serve(pc net.PacketConn) {
	buf := make([]byte, 1500)
	bcast := &net.UDPAddr{IP: net.IPv4bcast, Port: dhcpClientPort}
	for {
		n, _, err := pc.ReadFrom(buf)
		if err != nil {
			return
		}
		if reply := d.reply(buf[:n]); reply != nil {
			if _, err := pc.WriteTo(reply, bcast); err != nil {
				d.log.Debug("dhcp: cannot send reply", "err", err)
			}
		}
	}
}
