// Package egress is the egress policy: what the guest may reach and the
// record of what it tried. It owns the allow and deny rules (their syntax,
// the scopes merged by LoadPolicy), Policy and its decisions (Decide for a
// name and port, DecideName for the DNS server's question, Decider and
// StackPolicy as the interfaces the engines and the network stack ask), the
// dial guard every upstream connection goes through (never the host's own
// addresses, loopback, link-local or metadata; private ranges only behind
// an allow-private rule; --resolve pins), the DNS wildcard guard that bounds
// new names under a wildcard rule, the upstream connection slots, and the
// Event record each decision is logged as.
//
// It does not move bytes: the network stack, the MITM engines and the
// proxy in netfilter ask it and act on the answer. It imports none of
// vibedom's other packages.
package egress
