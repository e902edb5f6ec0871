package egress

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// Resolve maps one allowed name and port to the address the proxy connects
// to instead of the name's DNS answer, like curl's --resolve: the policy,
// the SNI and the Host header still use the name, and the upstream's
// certificate must still be valid for it. The user names the address, so
// it may be loopback or private (a staging server, a test server): the
// engine's dial guard lets exactly this name and port reach exactly this
// address (mitm.EngineConfig.Resolve), and nothing else reaches it.
type Resolve struct {
	Name string // normalised, no trailing dot
	Port uint16
	Addr netip.AddrPort
}

// ParseResolve parses "NAME:PORT:ADDR:ADDRPORT" ("api.example.com:443:127.0.0.1:8443",
// IPv6 as "[::1]:8443") or "NAME:PORT:ADDR" (the same port upstream).
func ParseResolve(spec string) (Resolve, error) {
	bad := func(why string) (Resolve, error) {
		return Resolve{}, fmt.Errorf("--resolve %q: %s (want NAME:PORT:ADDRESS[:PORT], e.g. api.example.com:443:127.0.0.1:8443)", spec, why)
	}
	name, rest, ok := strings.Cut(spec, ":")
	if !ok {
		return bad("no port")
	}
	portStr, addrStr, ok := strings.Cut(rest, ":")
	if !ok {
		return bad("no address")
	}
	n, err := NormalizeName(name)
	if err != nil {
		return bad(err.Error())
	}
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil || port == 0 {
		return bad("bad port " + strconv.Quote(portStr))
	}
	r := Resolve{Name: n, Port: uint16(port)}
	if ap, err := netip.ParseAddrPort(addrStr); err == nil {
		r.Addr = ap
	} else if a, err := netip.ParseAddr(strings.Trim(addrStr, "[]")); err == nil {
		r.Addr = netip.AddrPortFrom(a, uint16(port))
	} else {
		return bad("bad address " + strconv.Quote(addrStr))
	}
	if r.Addr.Port() == 0 {
		return bad("bad upstream port")
	}
	return r, nil
}
