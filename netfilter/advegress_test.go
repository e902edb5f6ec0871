package netfilter

import (
	"bufio"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vibedom/vibedom/netfilter/egress"
	"github.com/vibedom/vibedom/netfilter/internal/mitmtest"
	"github.com/vibedom/vibedom/netfilter/internal/nftest"
	"github.com/vibedom/vibedom/netfilter/mitm"
	"github.com/vibedom/vibedom/netfilter/netstack"
)

// TestExplicitProxyRequestTracked: a plain http:// request through the
// explicit proxy (a long response, a WebSocket) is an existing connection
// to its name too: a live deny must be able to close it, as it closes
// CONNECT tunnels.
func TestExplicitProxyRequestTracked(t *testing.T) {
	t.Parallel()
	forEngines(t, testExplicitProxyRequestTracked)
}

func testExplicitProxyRequestTracked(t *testing.T, kind string) {
	var mu sync.Mutex
	tracked := map[string][]net.Conn{}
	v := newEngineEnv(t, kind, "stream.example\n", func(c *mitm.EngineConfig) {
		c.Track = func(tg netstack.Target, conn net.Conn) func() {
			mu.Lock()
			defer mu.Unlock()
			tracked[tg.Name] = append(tracked[tg.Name], conn)
			return func() {}
		}
	})
	release := make(chan struct{})
	defer close(release)
	v.UpstreamPlain("stream.example", 80, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		io.WriteString(w, "data: first\n\n")
		w.(http.Flusher).Flush()
		select { // a stream that goes on until the deny ends it
		case <-release:
		case <-r.Context().Done():
		}
	}))
	proxy := v.ProxyListener()
	c, err := net.Dial("tcp", proxy.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "GET http://stream.example/events HTTP/1.1\r\nHost: stream.example\r\n\r\n")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	line, _ := bufio.NewReader(resp.Body).ReadString('\n')
	if !strings.Contains(line, "first") {
		t.Fatalf("stream: %q", line)
	}
	mu.Lock()
	conns := tracked["stream.example"]
	mu.Unlock()
	if len(conns) == 0 {
		t.Fatal("the explicit proxy's request to stream.example is not tracked: a live deny cannot close it")
	}
	for _, tc := range conns {
		tc.Close() // what a live deny does
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatal("the stream goes on after its tracked connection was closed")
		}
	}
}

// TestNoMITMRefusesECH: a hello to a no-mitm name that carries an
// encrypted ClientHello (ECH, or the older ESNI) names its real
// destination in the encrypted part: the outer SNI only names the
// front. Passed through, the provider's front end would route it to any
// site it hosts, past the allowlist; it is refused.
func TestNoMITMRefusesECH(t *testing.T) {
	t.Parallel()
	forEngines(t, testNoMITMRefusesECH)
}

func testNoMITMRefusesECH(t *testing.T, kind string) {
	v := newEngineEnv(t, kind, mitmtest.Rules+"pinned.test\n", func(c *mitm.EngineConfig) { c.NoMITM = []string{"pinned.test"} })
	v.UpstreamTLS("pinned.test", 443, v.UpCA, http.NotFoundHandler())
	for _, typ := range []uint16{0xfe0d, 0xffce} {
		conn := v.GuestConn("pinned.test", 443)
		hello := nftest.Handshake(nftest.Ext(0, nftest.SNIData("pinned.test")), nftest.Ext(typ, []byte{0, 1, 2, 3}))
		if _, err := conn.Write(nftest.Records(hello, 1<<14)); err != nil {
			t.Fatal(err)
		}
		conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		io.Copy(io.Discard, conn)
		conn.Close()
		ev := v.Events.Wait(t, "connect", func(e egress.Event) bool { return e.Kind == "connect" && e.Name == "pinned.test" })
		if ev.Decision != "deny" || !strings.Contains(ev.Reason, "encrypted ClientHello") {
			t.Errorf("extension %#x to a no-mitm name: %s, %q; want deny (encrypted ClientHello)", typ, ev.Decision, ev.Reason)
		}
		v.Events.Reset()
	}
}

// TestClosedGuestConnEndsUpstream: what a live deny does to a transparent
// connection (it closes the engine's end of the guest's connection) ends
// the upstream request too, on both engines: mitmdump must not keep
// streaming from the denied host.
func TestClosedGuestConnEndsUpstream(t *testing.T) {
	t.Parallel()
	forEngines(t, func(t *testing.T, kind string) {
		v := newEngineEnv(t, kind, mitmtest.Rules)
		started, ended := make(chan struct{}), make(chan struct{})
		var once sync.Once
		v.UpstreamTLS("api.test", 443, v.UpCA, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusOK)
			io.WriteString(w, "data: first\n\n")
			w.(http.Flusher).Flush()
			once.Do(func() { close(started) })
			<-r.Context().Done()
			close(ended)
		}))
		c, s := nftest.TCPPair(t)
		defer c.Close()
		tg := netstack.Target{Name: "api.test", Port: 443, Decision: v.Policy.Decide("api.test", 443),
			Guest: netip.MustParseAddrPort("10.0.2.15:40001"), Dialled: netip.MustParseAddrPort("198.18.0.1:443")}
		go v.Eng.HandleConn(t.Context(), s, tg)
		tc := tls.Client(c, &tls.Config{ServerName: "api.test", RootCAs: v.CA.Pool(), NextProtos: []string{"http/1.1"}})
		io.WriteString(tc, "GET /events HTTP/1.1\r\nHost: api.test\r\n\r\n")
		select {
		case <-started:
		case <-time.After(20 * time.Second):
			t.Fatal("the upstream never got the request")
		}
		s.Close() // the live deny
		select {
		case <-ended:
		case <-time.After(20 * time.Second):
			t.Fatal("the upstream request goes on after the guest's connection was closed")
		}
	})
}
