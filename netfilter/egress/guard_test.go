package egress

import (
	"github.com/vibedom/vibedom/netfilter/internal/nftest"

	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestClassifyAddr(t *testing.T) {
	t.Parallel()
	host := func(a netip.Addr) bool { return a == netip.MustParseAddr("203.0.113.9") }
	for _, tt := range []struct {
		addr string
		want AddrClass
	}{
		{"127.0.0.1", addrNever},
		{"127.255.0.9", addrNever},
		{"0.0.0.0", addrNever},
		{"0.1.2.3", addrNever},
		{"::", addrNever},
		{"::1", addrNever},
		{"169.254.169.254", addrNever},
		{"fe80::1", addrNever},
		{"224.0.0.251", addrNever},
		{"ff02::1", addrNever},
		{"255.255.255.255", addrNever},
		{"240.0.0.1", addrNever},
		{"::ffff:127.0.0.1", addrNever}, // IPv4-mapped
		{"::ffff:169.254.169.254", addrNever},
		{"::127.0.0.1", addrNever},                          // IPv4-compatible
		{"64:ff9b::7f00:1", addrNever},                      // NAT64 of 127.0.0.1
		{"64:ff9b::a9fe:a9fe", addrNever},                   // NAT64 of 169.254.169.254
		{"2002:7f00:1::1", addrNever},                       // 6to4 of 127.0.0.1
		{"2001:0:7f00:1::1", addrNever},                     // Teredo server 127.0.0.1
		{"2001:0:4136:e378:8000:63bf:80ff:fffe", addrNever}, // Teredo client ^ = 127.0.0.1
		{"203.0.113.9", addrHost},
		{"::ffff:203.0.113.9", addrHost},
		{"64:ff9b::cb00:7109", addrHost},
		{"10.1.2.3", AddrPrivate},
		{"172.16.0.1", AddrPrivate},
		{"192.168.1.1", AddrPrivate},
		{"100.64.0.1", AddrPrivate},
		{"fd00:ec2::254", AddrPrivate},
		{"::ffff:10.0.0.1", AddrPrivate},
		{"2002:c0a8:101::1", AddrPrivate}, // 6to4 of 192.168.1.1
		{"93.184.216.34", addrPublic},
		{"2606:4700::1", addrPublic},
		{"172.32.0.1", addrPublic},
	} {
		if got := ClassifyAddr(netip.MustParseAddr(tt.addr), host); got != tt.want {
			t.Errorf("classifyAddr(%s): got %v, want %v", tt.addr, got, tt.want)
		}
	}
}

func TestDialGuardPrivateRule(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var dialled []string
	raw := func(_ context.Context, _, addr string) (net.Conn, error) {
		mu.Lock()
		dialled = append(dialled, addr)
		mu.Unlock()
		return nil, errors.New("test: not dialling")
	}
	lookup := func(_ context.Context, name string) ([]netip.Addr, error) {
		return []netip.Addr{netip.MustParseAddr("10.1.2.3"), netip.MustParseAddr("fd00::5")}, nil
	}
	var recorded []Event
	events := EventSinkFunc(func(e Event) { mu.Lock(); recorded = append(recorded, e); mu.Unlock() })
	g := NewDialGuard(GuardConfig{Dial: raw, LookupIP: lookup, HostAddrs: nftest.NoHostAddrs,
		AllowPrivate: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")}}, events, nftest.DiscardLog)
	g.DialContext(t.Context(), "tcp", "db.example.com:5432")
	if len(dialled) != 1 || dialled[0] != "10.1.2.3:5432" {
		t.Errorf("dialled %v, want only 10.1.2.3:5432 (fd00::5 is outside the allowed range)", dialled)
	}
	mu.Lock()
	ev := slices.Clone(recorded)
	mu.Unlock()
	if len(ev) != 1 || ev[0].Decision != "deny" || !strings.Contains(ev[0].Reason, "allow-private fd00::5/128") {
		t.Errorf("events %+v: want one deny for fd00::5 saying which rule would allow it", ev)
	}
}

func TestAllowPrivateRule(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		text, want, err string
	}{
		{"allow-private 10.1.0.0/16", "10.1.0.0/16", ""},
		{"allow-private 192.168.1.7", "192.168.1.7/32", ""},
		{"allow-private fd12:3456::/32", "fd12:3456::/32", ""},
		{"allow-private 100.64.0.0/10", "100.64.0.0/10", ""},
		{"allow-private 0.0.0.0/0", "", "inside"},
		{"allow-private 8.8.8.0/24", "", "inside"},
		{"allow-private 127.0.0.1", "", "inside"},
		{"allow-private 10.0.0.0/7", "", "inside"},
		{"allow-private nonsense", "", "range"},
	} {
		r, err := ParseRule(tt.text, "test")
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("ParseRule(%q): got %v, want an error about %q", tt.text, err, tt.err)
			}
			continue
		}
		if err != nil || r.private.String() != tt.want {
			t.Errorf("ParseRule(%q): got %v %v, want %s", tt.text, r.private, err, tt.want)
		}
		if d := NewPolicy([]Rule{r}).Decide("10.1.2.3", 443); d.Allow {
			t.Errorf("%q allows a connection by itself", tt.text)
		}
	}
}

func TestAllowPrivateNotFromWorkspace(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	user := dir + "/user.txt"
	writeFile(t, user, "allow-private 10.1.0.0/16\n")
	// Even an approved workspace file cannot open a private range.
	for _, approved := range []bool{false, true} {
		ws := &WorkspaceScope{Data: []byte("allow-private 10.2.0.0/16\n"), Source: "ws/.vibedom/trusted_domains.txt", AllowApproved: approved}
		if _, err := LoadPolicy(PolicyConfig{NoBuiltins: true, UserFile: user, Workspace: ws}); err == nil ||
			!strings.Contains(err.Error(), "never from the workspace") {
			t.Errorf("workspace allow-private (approved %v): got %v, want a refusal", approved, err)
		}
	}
	p, err := LoadPolicy(PolicyConfig{NoBuiltins: true, UserFile: user, Allow: []string{"allow-private 10.3.0.0/16"}})
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(p.PrivateRanges()); got != "[10.1.0.0/16 10.3.0.0/16]" {
		t.Errorf("PrivateRanges: got %s", got)
	}
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestDialGuardControl checks the default dialer's last word: the socket's
// address is judged again, so nothing that reaches the dialer by another
// path connects to loopback, except the exact address a --resolve pin
// names.
func TestDialGuardControl(t *testing.T) {
	t.Parallel()
	ln := nftest.CountingListener(t)
	g := NewDialGuard(GuardConfig{HostAddrs: nftest.NoHostAddrs}, DiscardEvents{}, nftest.DiscardLog)
	if _, err := g.dialer.DialContext(t.Context(), "tcp", ln.Addr().String()); !errors.Is(err, ErrUpstreamAddress) {
		t.Errorf("dial %s: got %v, want ErrUpstreamAddress", ln.Addr(), err)
	}
	pinned := netip.MustParseAddrPort(ln.Addr().String())
	c, err := g.dialer.DialContext(context.WithValue(t.Context(), pinnedKey{}, pinned), "tcp", ln.Addr().String())
	if err != nil {
		t.Fatalf("dial the pinned address: %v", err)
	}
	c.Close()
	ln.WaitCount(t, 1)
	if n := ln.Count.Load(); n != 1 {
		t.Errorf("listener got %d connections, want only the pinned one", n)
	}
}

// TestDialGuardFallsBackAcrossFamilies checks that a name whose first
// address family does not answer still connects over the other (as
// net.Dialer's Happy Eyeballs did before the guard resolved names itself),
// and that the losing dial is abandoned.
func TestDialGuardFallsBackAcrossFamilies(t *testing.T) {
	t.Parallel()
	abandoned := make(chan struct{})
	raw := func(ctx context.Context, _, addr string) (net.Conn, error) {
		if strings.HasPrefix(addr, "[") { // IPv6: never answers
			<-ctx.Done()
			close(abandoned)
			return nil, ctx.Err()
		}
		c, s := net.Pipe()
		s.Close()
		return c, nil
	}
	lookup := func(context.Context, string) ([]netip.Addr, error) {
		return []netip.Addr{netip.MustParseAddr("2606:4700::1"), netip.MustParseAddr("93.184.216.34")}, nil
	}
	g := NewDialGuard(GuardConfig{Dial: raw, LookupIP: lookup, HostAddrs: nftest.NoHostAddrs}, DiscardEvents{}, nftest.DiscardLog)
	c, err := g.DialContext(t.Context(), "tcp", "dual.example.com:443")
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	c.Close()
	select {
	case <-abandoned:
	case <-time.After(20 * time.Second):
		t.Fatal("the IPv6 dial was not abandoned")
	}
}
