package netfilter

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"
)

func TestParseResolve(t *testing.T) {
	for _, tc := range []struct{ spec, want, err string }{
		{"api.example.com:443:127.0.0.1:8443", "api.example.com 443 127.0.0.1:8443", ""},
		{"API.Example.COM.:443:10.0.0.5", "api.example.com 443 10.0.0.5:443", ""},
		{"example.com:443:[::1]:8443", "example.com 443 [::1]:8443", ""},
		{"example.com:443:::1", "example.com 443 [::1]:443", ""},
		{"example.com", "", "no port"},
		{"example.com:443", "", "no address"},
		{"example.com:0:127.0.0.1", "", "bad port"},
		{"example.com:99999:127.0.0.1", "", "bad port"},
		{"example.com:443:not-an-ip", "", "bad address"},
		{"exa mple.com:443:127.0.0.1", "", "--resolve"},
		{"example.com:443:127.0.0.1:0", "", "bad upstream port"},
	} {
		r, err := ParseResolve(tc.spec)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: err %v, want %q", tc.spec, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", tc.spec, err)
			continue
		}
		if got := r.Name + " " + itoa(int(r.Port)) + " " + r.Addr.String(); got != tc.want {
			t.Errorf("%q: got %q, want %q", tc.spec, got, tc.want)
		}
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// TestResolvePin checks a pinned name and port reach the pinned loopback
// address through the engine's dial guard, and that nothing else reaches
// it: not another port of the name, not a name resolving to it, not the
// address itself.
func TestResolvePin(t *testing.T) {
	ln := countingListener(t)
	r, err := ParseResolve("svc.example.com:443:" + ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	lookup := func(context.Context, string) ([]netip.Addr, error) {
		return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
	}
	g := newDialGuard(EngineConfig{Resolve: []Resolve{r}, LookupIP: lookup, HostAddrs: noHostAddrs}, discardEvents{}, discardLog)
	c, err := g.DialContext(t.Context(), "tcp", "SVC.example.com:443")
	if err != nil {
		t.Fatalf("pinned dial: %v", err)
	}
	c.Close()
	ln.waitCount(t, 1)
	for _, addr := range []string{"svc.example.com:80", "other.example.com:443", ln.Addr().String()} {
		if _, err := g.DialContext(t.Context(), "tcp", addr); !errors.Is(err, ErrUpstreamAddress) {
			t.Errorf("dial %s: got %v, want ErrUpstreamAddress", addr, err)
		}
	}
	if n := ln.count.Load(); n != 1 {
		t.Errorf("the pinned address got %d connections, want only the pinned one", n)
	}
	res := ResolveResolver([]Resolve{r}, existsNone{})
	if ok, _ := res.Exists(context.Background(), "svc.example.com"); !ok {
		t.Errorf("a mapped name does not exist")
	}
	if ok, _ := res.Exists(context.Background(), "other.example.com"); ok {
		t.Errorf("an unmapped name was not asked of the next resolver")
	}
}

type existsNone struct{}

func (existsNone) Exists(context.Context, string) (bool, error) { return false, nil }

// closingListener is a loopback listener, closed when the test ends, that
// accepts every connection and closes it at once.
func closingListener(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	return ln
}
