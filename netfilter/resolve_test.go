package netfilter

import (
	"github.com/vibedom/vibedom/netfilter/egress"
	"github.com/vibedom/vibedom/netfilter/internal/nftest"

	"context"
	"errors"
	"net"
	"net/netip"
	"testing"
)

// TestResolvePin checks a pinned name and port reach the pinned loopback
// address through the engine's dial guard, and that nothing else reaches
// it: not another port of the name, not a name resolving to it, not the
// address itself.
func TestResolvePin(t *testing.T) {
	t.Parallel()
	ln := nftest.CountingListener(t)
	r, err := egress.ParseResolve("svc.example.com:443:" + ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	lookup := func(context.Context, string) ([]netip.Addr, error) {
		return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
	}
	g := egress.NewDialGuard(egress.GuardConfig{Resolve: []egress.Resolve{r}, LookupIP: lookup, HostAddrs: nftest.NoHostAddrs}, egress.DiscardEvents{}, nftest.DiscardLog)
	c, err := g.DialContext(t.Context(), "tcp", "SVC.example.com:443")
	if err != nil {
		t.Fatalf("pinned dial: %v", err)
	}
	c.Close()
	ln.WaitCount(t, 1)
	for _, addr := range []string{"svc.example.com:80", "other.example.com:443", ln.Addr().String()} {
		if _, err := g.DialContext(t.Context(), "tcp", addr); !errors.Is(err, egress.ErrUpstreamAddress) {
			t.Errorf("dial %s: got %v, want ErrUpstreamAddress", addr, err)
		}
	}
	if n := ln.Count.Load(); n != 1 {
		t.Errorf("the pinned address got %d connections, want only the pinned one", n)
	}
	res := ResolveResolver([]egress.Resolve{r}, existsNone{})
	if ok, _ := res.Exists(context.Background(), "svc.example.com"); !ok {
		t.Errorf("a mapped name does not exist")
	}
	if ok, _ := res.Exists(context.Background(), "other.example.com"); ok {
		t.Errorf("an unmapped name was not asked of the next resolver")
	}
}

type existsNone struct{}

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

func (existsNone) Exists(context.Context, string) (bool, error) { return false, nil }
