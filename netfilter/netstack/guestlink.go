package netstack

import (
	"net"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// HeaderLen is the length of an Ethernet header: a frame on the link is
// HeaderLen bytes and at most MTU bytes of payload.
const HeaderLen = ethHeaderLen

// NewLink returns a gVisor link endpoint of MTU mtu and hardware address
// mac whose Ethernet frames travel one per datagram over conn, the link
// the gateway serves: it is for a second gVisor stack that plays the
// guest on the VM's end of SocketPair (tests, tools). read delivers the
// frames conn receives to the endpoint until reading fails, and returns
// that error (os.ErrDeadlineExceeded after a read deadline). The endpoint
// filters nothing.
func NewLink(conn net.Conn, mtu uint32, mac tcpip.LinkAddress) (ep stack.LinkEndpoint, read func() error) {
	var stats linkStats
	link := newFrameLink(mtu, mac, &stats)
	link.setConn(conn)
	return link, func() error { return link.readFrames(nil) }
}
