// Package netfilter is the guest's only way out, assembled: it hands the
// connections the network stack (netfilter/netstack) admits to the MITM
// proxy, one of two engines (the Go engine of netfilter/mitm, or mitmdump
// with our addon, run from here), which checks the TLS SNI or Host against
// the egress policy (netfilter/egress) and passes each request through the
// request filters built here (DLP, placeholder swap); it writes the
// network logs. NewEgress is that assembly for one guest: the caller gets
// the proxy URL and the VM's end of the link, and sees neither the engine
// nor the stack. Nothing it enforces depends on code running in the guest.
//
// It does not scrub bodies itself: a RequestFilter (the contract is
// netfilter/mitm's; the dlp engine, through an adapter) is plugged into
// the proxy's request path.
package netfilter
