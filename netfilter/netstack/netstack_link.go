package netstack

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"syscall"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// ethHeaderLen is the size of an Ethernet II header (no VLAN tag).
const ethHeaderLen = header.EthernetMinimumSize

// frameLink is a gVisor link endpoint whose Ethernet frames travel one per
// datagram over a connected datagram socket: the transport of QEMU's
// "-netdev dgram" and of vz's file-handle network attachment. It writes
// frames synchronously in the caller's goroutine; frames read from the
// socket are handed to it by deliver.
//
// On the host side it sends ARP replies only about addresses arpReplyOK
// accepts: in spoofing mode gVisor would otherwise claim every address
// the guest asks about, including the guest's own (which makes DHCP
// clients decline their lease).
type frameLink struct {
	mtu        atomic.Uint32
	mac        tcpip.LinkAddress
	arpReplyOK func(ip [4]byte) bool // nil: no filter

	ioMu sync.RWMutex
	io   frameIO

	wmu    sync.Mutex // serialises WritePackets' use of wbufs
	wbufs  [][]byte
	wbatch [][]byte

	dispMu     sync.RWMutex
	dispatcher stack.NetworkDispatcher

	stats *linkStats
}

// linkStats counts what crossed the link and what was dropped, by reason.
type linkStats struct {
	framesIn, framesOut, bytesIn, bytesOut atomic.Uint64
	malformed, spoofed, notForUs           atomic.Uint64
	ipv6, otherProto, fragments            atomic.Uint64
	udp, icmp, multicast, martians         atomic.Uint64
	writeErrors, writeNoBufs               atomic.Uint64
}

var _ stack.LinkEndpoint = (*frameLink)(nil)

func newFrameLink(mtu uint32, mac tcpip.LinkAddress, stats *linkStats) *frameLink {
	l := &frameLink{mac: mac, stats: stats}
	l.mtu.Store(mtu)
	return l
}

// setConn makes c the link's socket (nil detaches it).
func (l *frameLink) setConn(c net.Conn) {
	var fio frameIO
	if c != nil {
		fio = newFrameIO(c, l.frameSize())
	}
	l.ioMu.Lock()
	l.io = fio
	l.ioMu.Unlock()
}

func (l *frameLink) getIO() frameIO {
	l.ioMu.RLock()
	defer l.ioMu.RUnlock()
	return l.io
}

// frameSize is the largest frame the link carries: MTU plus the Ethernet
// header. Longer datagrams are not frames of this link.
func (l *frameLink) frameSize() int { return int(l.mtu.Load()) + ethHeaderLen }

// MTU implements stack.LinkEndpoint: the largest IP packet, without the
// Ethernet header.
func (l *frameLink) MTU() uint32 { return l.mtu.Load() }

// SetMTU implements stack.LinkEndpoint.
func (l *frameLink) SetMTU(mtu uint32) { l.mtu.Store(mtu) }

// MaxHeaderLength implements stack.LinkEndpoint.
func (l *frameLink) MaxHeaderLength() uint16 { return ethHeaderLen }

// LinkAddress implements stack.LinkEndpoint.
func (l *frameLink) LinkAddress() tcpip.LinkAddress { return l.mac }

// SetLinkAddress implements stack.LinkEndpoint. The address is fixed at
// construction; changes are ignored.
func (l *frameLink) SetLinkAddress(tcpip.LinkAddress) {}

// Capabilities implements stack.LinkEndpoint. Checksums of received
// packets are not verified: the link is a socket inside one machine, and
// a forged checksum costs an attacker nothing, so verifying buys no
// safety. Sent packets always carry real checksums (the guest's virtio-net
// gets no offload metadata over a datagram socket).
func (l *frameLink) Capabilities() stack.LinkEndpointCapabilities {
	return stack.CapabilityResolutionRequired | stack.CapabilityRXChecksumOffload
}

// Attach implements stack.LinkEndpoint.
func (l *frameLink) Attach(d stack.NetworkDispatcher) {
	l.dispMu.Lock()
	l.dispatcher = d
	l.dispMu.Unlock()
}

// IsAttached implements stack.LinkEndpoint.
func (l *frameLink) IsAttached() bool {
	l.dispMu.RLock()
	defer l.dispMu.RUnlock()
	return l.dispatcher != nil
}

// Wait implements stack.LinkEndpoint; the link owns no goroutines.
func (l *frameLink) Wait() {}

// ARPHardwareType implements stack.LinkEndpoint.
func (l *frameLink) ARPHardwareType() header.ARPHardwareType { return header.ARPHardwareEther }

// AddHeader implements stack.LinkEndpoint.
func (l *frameLink) AddHeader(pkt *stack.PacketBuffer) {
	src := pkt.EgressRoute.LocalLinkAddress
	if src == "" {
		src = l.mac
	}
	eth := header.Ethernet(pkt.LinkHeader().Push(ethHeaderLen))
	eth.Encode(&header.EthernetFields{
		SrcAddr: src,
		DstAddr: pkt.EgressRoute.RemoteLinkAddress,
		Type:    pkt.NetworkProtocolNumber,
	})
}

// ParseHeader implements stack.LinkEndpoint.
func (l *frameLink) ParseHeader(pkt *stack.PacketBuffer) bool {
	_, ok := pkt.LinkHeader().Consume(ethHeaderLen)
	return ok
}

// Close implements stack.LinkEndpoint.
func (l *frameLink) Close() {}

// SetOnCloseAction implements stack.LinkEndpoint.
func (l *frameLink) SetOnCloseAction(func()) {}

// WritePackets implements stack.LinkEndpoint: one datagram per packet,
// the whole list in as few system calls as the platform allows.
func (l *frameLink) WritePackets(pkts stack.PacketBufferList) (int, tcpip.Error) {
	fio := l.getIO()
	if fio == nil {
		return 0, &tcpip.ErrClosedForSend{}
	}
	l.wmu.Lock()
	defer l.wmu.Unlock()
	batch := l.wbatch[:0]
	size := l.frameSize()
	for i, pkt := range pkts.AsSlice() {
		if l.suppressARP(pkt) {
			continue
		}
		if i >= len(l.wbufs) {
			l.wbufs = append(l.wbufs, make([]byte, 0, size))
		}
		b := l.wbufs[i][:0]
		if n := pkt.Size(); cap(b) < n {
			b = make([]byte, 0, n)
			l.wbufs[i] = b
		}
		vl, off := pkt.AsViewList()
		for v := vl.Front(); v != nil; v = v.Next() {
			s := v.AsSlice()
			if off >= len(s) {
				off -= len(s)
				continue
			}
			b = append(b, s[off:]...)
			off = 0
		}
		batch = append(batch, b)
	}
	l.wbatch = batch[:0]
	if len(batch) == 0 {
		return pkts.Len(), nil
	}
	sent, err := fio.write(batch)
	for _, b := range batch[:sent] {
		l.stats.bytesOut.Add(uint64(len(b)))
	}
	l.stats.framesOut.Add(uint64(sent))
	if err != nil {
		l.stats.writeErrors.Add(uint64(len(batch) - sent))
		if errors.Is(err, syscall.ENOBUFS) {
			return pkts.Len(), &tcpip.ErrNoBufferSpace{}
		}
		return pkts.Len(), &tcpip.ErrClosedForSend{}
	}
	return pkts.Len(), nil
}

// suppressARP reports whether pkt is an ARP reply the host side must not
// send: one about an address arpReplyOK refuses.
func (l *frameLink) suppressARP(pkt *stack.PacketBuffer) bool {
	if l.arpReplyOK == nil || pkt.NetworkProtocolNumber != header.ARPProtocolNumber {
		return false
	}
	h := header.ARP(pkt.NetworkHeader().Slice())
	if !h.IsValid() || h.Op() != header.ARPReply {
		return false
	}
	return !l.arpReplyOK([4]byte(h.ProtocolAddressSender()))
}

// readFrames reads frames from the socket and delivers those check
// accepts (all, when check is nil) until reading fails. Datagrams longer
// than a frame are counted as malformed and dropped.
func (l *frameLink) readFrames(check func([]byte) bool) error {
	fio := l.getIO()
	if fio == nil {
		return net.ErrClosed
	}
	size := l.frameSize()
	for {
		frames, err := fio.read()
		if err != nil {
			return err
		}
		for _, f := range frames {
			l.stats.framesIn.Add(1)
			l.stats.bytesIn.Add(uint64(len(f)))
			if len(f) > size {
				l.stats.malformed.Add(1)
				continue
			}
			if check == nil || check(f) {
				l.deliver(f)
			}
		}
	}
}

// deliver hands one received frame (already checked by the caller) to the
// stack. frame is copied; the caller may reuse it.
func (l *frameLink) deliver(frame []byte) {
	l.dispMu.RLock()
	d := l.dispatcher
	l.dispMu.RUnlock()
	if d == nil || len(frame) < ethHeaderLen {
		return
	}
	proto := tcpip.NetworkProtocolNumber(uint16(frame[12])<<8 | uint16(frame[13]))
	pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithData(frame)})
	defer pkt.DecRef()
	if !l.ParseHeader(pkt) {
		return
	}
	eth := header.Ethernet(frame)
	switch dst := eth.DestinationAddress(); {
	case dst == header.EthernetBroadcastAddress:
		pkt.PktType = tcpip.PacketBroadcast
	case header.IsMulticastEthernetAddress(dst):
		pkt.PktType = tcpip.PacketMulticast
	case dst == l.mac:
		pkt.PktType = tcpip.PacketHost
	default:
		pkt.PktType = tcpip.PacketOtherHost
	}
	d.DeliverNetworkPacket(proto, pkt)
}
