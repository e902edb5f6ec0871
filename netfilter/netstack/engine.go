package netstack

import (
	"github.com/vibedom/vibedom/netfilter/egress"

	"context"
	"net"
	"net/netip"
)

// Target is what an admitted guest TCP connection was admitted for.
type Target struct {
	// Name is the normalised host name (lower case, punycode, no trailing
	// dot) the connection was matched to, or an IP literal when a rule names
	// the IP.
	Name string
	// Port is the destination port the guest dialled.
	Port uint16
	// Decision is the policy decision that admitted the connection.
	Decision egress.Decision
	// Guest is the guest's source address; Dialled the address it dialled
	// (a synthetic address handed out by the DNS server).
	Guest, Dialled netip.AddrPort
}

// Engine takes over guest TCP connections once they are admitted. It owns the
// connection it is handed and closes it. Implementations enforce the second
// half of the policy: the TLS SNI or HTTP Host header must agree with
// Target.Name, and an explicit proxy's CONNECT target and inner SNI/Host must
// all be allowed and agree.
type Engine interface {
	// HandleConn serves a transparently intercepted connection to t.
	HandleConn(ctx context.Context, conn net.Conn, t Target)
	// HandleProxyConn serves a connection to the explicit proxy (HTTP
	// CONNECT and absolute-URI requests) from the guest address src.
	HandleProxyConn(ctx context.Context, conn net.Conn, src netip.AddrPort)
}
