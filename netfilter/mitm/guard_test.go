package mitm_test

import (
	"github.com/vibedom/vibedom/netfilter/egress"
	"github.com/vibedom/vibedom/netfilter/internal/mitmtest"
	"github.com/vibedom/vibedom/netfilter/internal/nftest"

	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestDialGuardNeverDialsLocal drives the real explicit proxy and the
// transparent path with the spellings and rules a hostile guest would try
// against a loopback listener the test owns: it must never get a
// connection. Before the guard the explicit proxy dialled any IP a rule
// named (`0.0.0.0:*` reached every loopback port) and names resolving to
// loopback reached it through a rule naming the name.
func TestDialGuardNeverDialsLocal(t *testing.T) {
	t.Parallel()
	target := nftest.CountingListener(t)
	p := target.Port()
	rules := strings.Join([]string{"0.0.0.0:*", "127.0.0.1:*", "[::1]:*", "[::ffff:127.0.0.1]:*",
		"sneaky.test:*", "meta.test:*", "mixed.test:*"}, "\n")
	v, _ := mitmtest.NewGo(t, rules)
	v.Answer("sneaky.test", "127.0.0.1")
	v.Answer("meta.test", "169.254.169.254")
	v.Answer("mixed.test", "::ffff:127.0.0.1", "0.0.0.0")
	proxy := v.ProxyListener()

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
			c := v.GuestConn(name, uint16(pn))
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
			c := v.GuestConn(name, uint16(pn))
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
	v.Events.Wait(t, "guard refusal", func(e egress.Event) bool {
		return e.Kind == "connect" && strings.Contains(e.Reason, "vibedom never connects to")
	})
	if n := target.Count.Load(); n != 0 {
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
	t.Parallel()
	own := ownAddr(t)
	target := nftest.CountingListenerOn(t, net.JoinHostPort(own.String(), "0"))
	p := target.Port()
	allowOwn := "allow-private " + own.String()
	rules := "own.test:*\nlan.test:*\nopen.test:*\nloop.test:*\nmeta.test:*\nallow-private 10.9.0.0/16\n"
	if egress.ClassifyAddr(own, nil) == egress.AddrPrivate {
		rules += allowOwn + "\n"
	}
	v, _ := mitmtest.NewGo(t, rules)
	v.SetHostAddrs(own)
	v.Answer("own.test", own.String())
	v.Answer("lan.test", "192.168.77.1")
	v.Answer("open.test", "10.9.8.7")
	v.Answer("loop.test", "127.0.0.1")
	v.Answer("meta.test", "169.254.169.254")

	proxy := v.ProxyListener()
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
	if n := target.Count.Load(); n != 0 {
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
		v.Events.Wait(t, "alert for "+want, func(e egress.Event) bool {
			return e.Kind == "connect" && e.Decision == "deny" && strings.HasPrefix(e.Dst, want) ||
				e.Kind == "connect" && e.Decision == "deny" && strings.HasPrefix(e.Dst, "["+want)
		})
	}
	// open.test's range is allowed: the guard passes it to the raw dialer
	// (the test's refuses everything off the machine), no alert.
	get("open.test")
	for _, e := range v.Events.All() {
		if strings.HasPrefix(e.Dst, "10.9.8.7") {
			t.Errorf("an allowed private address was refused: %+v", e)
		}
	}
}

// ownAddr is a non-loopback address of this machine's interfaces.
func ownAddr(t *testing.T) netip.Addr {
	t.Helper()
	as, err := egress.InterfaceAddrs()
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
