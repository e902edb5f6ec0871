// Package netstack is the guest's network as the host serves it: a
// userspace TCP/IP stack (gVisor) wired to the guest's NIC through a socket
// pair, with the gateway's DHCP server, its DNS server (synthetic addresses
// for allowed names, refusals for the rest) and a TCP admission step that
// asks the egress policy about every connection and hands the admitted ones
// to an Engine. It also drops every frame the gateway has no business
// receiving (spoofed addresses, other protocols) and rate-limits its events.
//
// It does not look inside admitted connections: the Engine (the MITM proxy,
// in netfilter) checks names, scrubs and logs requests. It decides nothing
// itself: egress.StackPolicy does.
package netstack
