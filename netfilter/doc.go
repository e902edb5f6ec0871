// Package netfilter is the guest's only way out, assembled: it hands the
// connections the network stack (netfilter/netstack) admits to the MITM
// proxy, one of two engines (the Go engine, or mitmdump with our addon),
// which checks the TLS SNI or Host against the egress policy
// (netfilter/egress), passes each request through the request filters
// (DLP, placeholder swap) and writes the network logs. Nothing it enforces
// depends on code running in the guest.
//
// It does not scrub bodies itself: a RequestFilter (the contract is
// netfilter/mitm's; the dlp engine, through an adapter) is plugged into
// the proxy's request path.
package netfilter
