package netfilter

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

var discardLog = slog.New(slog.DiscardHandler)

func noHostAddrs() ([]netip.Addr, error) { return nil, nil }

// countedListener counts the connections it accepts (and closes them).
type countedListener struct {
	net.Listener
	count atomic.Int64
}

func countingListener(t *testing.T) *countedListener {
	t.Helper()
	return countingListenerOn(t, "127.0.0.1:0")
}

func countingListenerOn(t *testing.T, addr string) *countedListener {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	cl := &countedListener{Listener: ln}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			cl.count.Add(1)
			c.Close()
		}
	}()
	return cl
}

// waitCount waits until the listener has accepted n connections.
func (l *countedListener) waitCount(t *testing.T, n int64) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for l.count.Load() < n {
		if time.Now().After(deadline) {
			t.Fatalf("listener accepted %d connections, want %d", l.count.Load(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (l *countedListener) port() string {
	_, p, _ := net.SplitHostPort(l.Addr().String())
	return p
}

func TestClassifyAddr(t *testing.T) {
	host := func(a netip.Addr) bool { return a == netip.MustParseAddr("203.0.113.9") }
	for _, tt := range []struct {
		addr string
		want addrClass
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
		{"10.1.2.3", addrPrivate},
		{"172.16.0.1", addrPrivate},
		{"192.168.1.1", addrPrivate},
		{"100.64.0.1", addrPrivate},
		{"fd00:ec2::254", addrPrivate},
		{"::ffff:10.0.0.1", addrPrivate},
		{"2002:c0a8:101::1", addrPrivate}, // 6to4 of 192.168.1.1
		{"93.184.216.34", addrPublic},
		{"2606:4700::1", addrPublic},
		{"172.32.0.1", addrPublic},
	} {
		if got := classifyAddr(netip.MustParseAddr(tt.addr), host); got != tt.want {
			t.Errorf("classifyAddr(%s): got %v, want %v", tt.addr, got, tt.want)
		}
	}
}

// TestDialGuardNeverDialsLocal drives the real explicit proxy and the
// transparent path with the spellings and rules a hostile guest would try
// against a loopback listener the test owns: it must never get a
// connection. Before the guard the explicit proxy dialled any IP a rule
// named (`0.0.0.0:*` reached every loopback port) and names resolving to
// loopback reached it through a rule naming the name.
func TestDialGuardNeverDialsLocal(t *testing.T) {
	target := countingListener(t)
	p := target.port()
	rules := strings.Join([]string{"0.0.0.0:*", "127.0.0.1:*", "[::1]:*", "[::ffff:127.0.0.1]:*",
		"sneaky.test:*", "meta.test:*", "mixed.test:*"}, "\n")
	v := newTestEnv(t, rules)
	v.answer("sneaky.test", "127.0.0.1")
	v.answer("meta.test", "169.254.169.254")
	v.answer("mixed.test", "::ffff:127.0.0.1", "0.0.0.0")
	proxy := v.proxyListener()

	// CONNECT and absolute-URI requests to the explicit proxy.
	for _, host := range []string{"0.0.0.0", "127.0.0.1", "[::ffff:127.0.0.1]", "[::ffff:0.0.0.0]", "2130706433",
		"0177.0.0.1", "0x7f.1", "127.1", "0x7f000001", "sneaky.test", "mixed.test", "localhost", "[::]", "[::1]"} {
		t.Run("CONNECT "+host, func(t *testing.T) {
			conn := dialProxy(t, proxy.Host)
			fmt.Fprintf(conn, "CONNECT %s:%s HTTP/1.1\r\nHost: %[1]s:%[2]s\r\n\r\n", host, p)
			br := bufio.NewReader(conn)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				return // the proxy hung up: refused
			}
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				// Tunnel open: speak plain HTTP through it; the dial
				// happens now.
				fmt.Fprintf(conn, "GET / HTTP/1.1\r\nHost: %s:%s\r\n\r\n", host, p)
				if r2, err := http.ReadResponse(br, nil); err == nil {
					io.Copy(io.Discard, r2.Body)
					if r2.StatusCode < 400 {
						t.Errorf("request through the tunnel: status %d", r2.StatusCode)
					}
				}
			}
		})
		t.Run("GET http://"+host, func(t *testing.T) {
			conn := dialProxy(t, proxy.Host)
			fmt.Fprintf(conn, "GET http://%s:%s/ HTTP/1.1\r\nHost: %[1]s:%[2]s\r\n\r\n", host, p)
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				return
			}
			io.Copy(io.Discard, resp.Body)
			if resp.StatusCode < 400 {
				t.Errorf("status %d, want a refusal", resp.StatusCode)
			}
		})
	}

	// The transparent path, handed targets as if the stack had admitted
	// them (the engine must not trust that it refused them first): HTTP,
	// and silence on a non-web port (spliced).
	pn, _ := strconv.Atoi(p)
	for _, name := range []string{"127.0.0.1", "0.0.0.0", "sneaky.test", "meta.test"} {
		t.Run("transparent HTTP "+name, func(t *testing.T) {
			c := v.guestConn(name, uint16(pn))
			defer c.Close()
			fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s:%s\r\n\r\n", name, p)
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				return
			}
			io.Copy(io.Discard, resp.Body)
			if resp.StatusCode != http.StatusBadGateway {
				t.Errorf("status %d, want 502", resp.StatusCode)
			}
		})
		t.Run("transparent splice "+name, func(t *testing.T) {
			c := v.guestConn(name, uint16(pn))
			defer c.Close()
			c.Write([]byte{0}) // neither TLS nor HTTP: spliced
			c.SetReadDeadline(time.Now().Add(20 * time.Second))
			io.Copy(io.Discard, c) // ends when the engine gives up
		})
	}
	// The explicit proxy says why at CONNECT time already.
	conn := dialProxy(t, proxy.Host)
	fmt.Fprintf(conn, "CONNECT 0.0.0.0:%s HTTP/1.1\r\nHost: 0.0.0.0:%[1]s\r\n\r\n", p)
	if resp, err := http.ReadResponse(bufio.NewReader(conn), nil); err != nil {
		t.Error(err)
	} else if body, _ := io.ReadAll(resp.Body); resp.StatusCode != http.StatusForbidden || !strings.Contains(string(body), "never reachable, whatever the rules say") {
		t.Errorf("CONNECT 0.0.0.0 with a rule allowing it: %d %q, want 403 saying it is never reachable", resp.StatusCode, body)
	}
	v.events.wait(t, "guard refusal", func(e Event) bool {
		return e.Kind == "connect" && strings.Contains(e.Reason, "vibedom never connects to")
	})
	if n := target.count.Load(); n != 0 {
		t.Fatalf("the loopback listener got %d connections through the proxy", n)
	}
}

func dialProxy(t *testing.T, addr string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	return conn
}

// TestDialGuardHostAndPrivate checks that a name whose DNS answer is the
// host's own address never reaches a service bound there, even with an
// allow-private rule covering it, and that private answers are refused
// (as alerts) unless a user rule opens their range.
func TestDialGuardHostAndPrivate(t *testing.T) {
	own := ownAddr(t)
	target := countingListenerOn(t, net.JoinHostPort(own.String(), "0"))
	p := target.port()
	allowOwn := "allow-private " + own.String()
	rules := "own.test:*\nlan.test:*\nopen.test:*\nloop.test:*\nmeta.test:*\nallow-private 10.9.0.0/16\n"
	if classifyAddr(own, nil) == addrPrivate {
		rules += allowOwn + "\n"
	}
	v := newTestEnv(t, rules)
	v.mu.Lock()
	v.hosts = []netip.Addr{own}
	v.mu.Unlock()
	v.answer("own.test", own.String())
	v.answer("lan.test", "192.168.77.1")
	v.answer("open.test", "10.9.8.7")
	v.answer("loop.test", "127.0.0.1")
	v.answer("meta.test", "169.254.169.254")

	proxy := v.proxyListener()
	get := func(name string) int {
		conn := dialProxy(t, proxy.Host)
		fmt.Fprintf(conn, "GET http://%s:%s/ HTTP/1.1\r\nHost: %[1]s:%[2]s\r\n\r\n", name, p)
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("GET %s: %v", name, err)
		}
		io.Copy(io.Discard, resp.Body)
		return resp.StatusCode
	}
	if got := get("own.test"); got != http.StatusBadGateway {
		t.Errorf("own.test: status %d, want 502", got)
	}
	if n := target.count.Load(); n != 0 {
		t.Fatalf("a service on the host's own address %s got %d connections", own, n)
	}
	if got := get("lan.test"); got != http.StatusBadGateway {
		t.Errorf("lan.test: status %d, want 502", got)
	}
	// A name that leads to loopback or the metadata address is an alert
	// too (the red team found these logged as errors, out of sight).
	for _, n := range []string{"loop.test", "meta.test"} {
		if got := get(n); got != http.StatusBadGateway {
			t.Errorf("%s: status %d, want 502", n, got)
		}
	}
	for _, want := range []string{own.String(), "192.168.77.1", "127.0.0.1", "169.254.169.254"} {
		v.events.wait(t, "alert for "+want, func(e Event) bool {
			return e.Kind == "connect" && e.Decision == "deny" && strings.HasPrefix(e.Dst, want) ||
				e.Kind == "connect" && e.Decision == "deny" && strings.HasPrefix(e.Dst, "["+want)
		})
	}
	// open.test's range is allowed: the guard passes it to the raw dialer
	// (the test's refuses everything off the machine), no alert.
	get("open.test")
	for _, e := range v.events.all() {
		if strings.HasPrefix(e.Dst, "10.9.8.7") {
			t.Errorf("an allowed private address was refused: %+v", e)
		}
	}
}

// ownAddr is a non-loopback address of this machine's interfaces.
func ownAddr(t *testing.T) netip.Addr {
	t.Helper()
	as, err := interfaceAddrs()
	if err != nil {
		t.Skipf("cannot list interface addresses: %v", err)
	}
	for _, a := range as {
		if a.Is4() && !a.IsLoopback() && !a.IsLinkLocalUnicast() {
			return a
		}
	}
	t.Skip("no non-loopback IPv4 address on this machine")
	return netip.Addr{}
}

func TestDialGuardPrivateRule(t *testing.T) {
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
	events := &memSink{}
	g := newDialGuard(EngineConfig{Dial: raw, LookupIP: lookup, HostAddrs: noHostAddrs,
		AllowPrivate: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")}}, events, discardLog)
	g.DialContext(t.Context(), "tcp", "db.example.com:5432")
	if len(dialled) != 1 || dialled[0] != "10.1.2.3:5432" {
		t.Errorf("dialled %v, want only 10.1.2.3:5432 (fd00::5 is outside the allowed range)", dialled)
	}
	ev := events.all()
	if len(ev) != 1 || ev[0].Decision != "deny" || !strings.Contains(ev[0].Reason, "allow-private fd00::5/128") {
		t.Errorf("events %+v: want one deny for fd00::5 saying which rule would allow it", ev)
	}
}

func TestAllowPrivateRule(t *testing.T) {
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
	ln := countingListener(t)
	g := newDialGuard(EngineConfig{HostAddrs: noHostAddrs}, discardEvents{}, discardLog)
	if _, err := g.dialer.DialContext(t.Context(), "tcp", ln.Addr().String()); !errors.Is(err, ErrUpstreamAddress) {
		t.Errorf("dial %s: got %v, want ErrUpstreamAddress", ln.Addr(), err)
	}
	pinned := netip.MustParseAddrPort(ln.Addr().String())
	c, err := g.dialer.DialContext(context.WithValue(t.Context(), pinnedKey{}, pinned), "tcp", ln.Addr().String())
	if err != nil {
		t.Fatalf("dial the pinned address: %v", err)
	}
	c.Close()
	ln.waitCount(t, 1)
	if n := ln.count.Load(); n != 1 {
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
	g := newDialGuard(EngineConfig{Dial: raw, LookupIP: lookup, HostAddrs: noHostAddrs}, discardEvents{}, discardLog)
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
