package egress

import (
	"log/slog"
	"net/netip"
	"strings"
)

// What a caller outside this package needs to know about a rule to check it
// before it joins a running session's policy (session: vibedom allow/deny).

// AllowPrivate reports whether r is an allow-private rule (it opens a
// private range and names no destination).
func (r Rule) AllowPrivate() bool { return r.private.IsValid() }

// NoMITM is a no-mitm rule's name ("" for any other rule).
func (r Rule) NoMITM() string { return r.noMITM }

// Addr is the address an IP-literal rule names.
func (r Rule) Addr() (netip.Addr, bool) { return r.ip, r.ip.IsValid() }

// Host is the rule's normalised name (a wildcard's base without "*."), or
// its IP literal; "" for allow-private.
func (r Rule) Host() string { return r.host }

// Wildcard reports whether r is a "*.base" rule.
func (r Rule) Wildcard() bool { return r.wildcard }

// Matches reports whether r covers name (normalised, or an IP literal) on
// port, allow or deny alike.
func (r Rule) Matches(name string, port uint16) bool {
	if !r.matchesPort(port) {
		return false
	}
	if ip, ok := ParseAddr(name); ok {
		return r.ip.IsValid() && r.ip == ip
	}
	return r.matchesName(name)
}

// Example is one name and port the rule covers: its name (for a wildcard,
// a name one label below its base) and its port (443 when it covers the
// default ports or every port).
func (r Rule) Example() (string, uint16) {
	name := r.host
	if r.wildcard {
		name = "vibedom-example." + r.host
	}
	port := r.port
	if port == 0 {
		port = 443
	}
	return name, port
}

// GuardedAddr returns an error wrapping ErrUpstreamAddress when the dial
// guard would never dial a: loopback, unspecified, link-local (metadata),
// multicast, reserved, one of this host's own addresses, or a private
// address no range of private covers. nil means a rule may name it.
func GuardedAddr(a netip.Addr, private []netip.Prefix) error {
	g := NewDialGuard(GuardConfig{AllowPrivate: private}, nil, slog.New(slog.DiscardHandler))
	_, err := g.Check(a)
	return err
}

// LocalName reports whether name (normalised) is one every resolver keeps
// on the host itself (RFC 6761 localhost, .local, .internal metadata
// names): a live rule naming it is refused.
func LocalName(name string) bool {
	for _, s := range []string{"localhost", "local", "internal", "localdomain", "home.arpa"} {
		if name == s || strings.HasSuffix(name, "."+s) {
			return true
		}
	}
	return false
}

// Rechecker is an optional capability of a Decider that may hold a
// decision while the user is asked (ask mode): Recheck decides again, for
// a connection already admitted (the mitmproxy engine's upstream dial),
// without asking anyone.
type Rechecker interface {
	Recheck(name string, port uint16) Decision
}

// Recheck implements Rechecker: the wrapped policy's Recheck when it has
// one, else Decide; the wildcard budget applies either way.
func (w *WildcardLimited) Recheck(name string, port uint16) Decision {
	if r, ok := w.p.(Rechecker); ok {
		return w.limit(name, r.Recheck(name, port))
	}
	return w.Decide(name, port)
}

// Recheck decides name:port for an admitted connection: d, or the
// Rechecker's answer when dec has one.
func Recheck(dec Decider, name string, port uint16) Decision {
	if r, ok := dec.(Rechecker); ok {
		return r.Recheck(name, port)
	}
	return dec.Decide(name, port)
}
