package mitm_test

import (
	"github.com/vibedom/vibedom/netfilter/egress"
	"github.com/vibedom/vibedom/netfilter/internal/mitmtest"

	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// switchingUpstream is a cooperating upstream: it answers every request
// with 101 (to whatever protocol the request asked for, "foo" when none)
// and then records every byte the proxy sends it.
type switchingUpstream struct {
	mu       sync.Mutex
	upgrades []string // the Upgrade header of each request it saw
	raw      strings.Builder
	finished int // handlers done recording
}

func (u *switchingUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	up := r.Header.Get("Upgrade")
	u.mu.Lock()
	u.upgrades = append(u.upgrades, up)
	u.mu.Unlock()
	if up == "" {
		up = "foo"
	}
	c, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return
	}
	defer c.Close()
	fmt.Fprintf(brw, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: %s\r\n\r\n", up)
	brw.Flush()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	b, _ := io.ReadAll(brw)
	u.mu.Lock()
	u.raw.Write(b)
	u.finished++
	u.mu.Unlock()
}

// seen waits until every request's handler has recorded what followed it,
// then returns the Upgrade headers and the bytes.
func (u *switchingUpstream) seen(t *testing.T) ([]string, string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		u.mu.Lock()
		if u.finished == len(u.upgrades) {
			defer u.mu.Unlock()
			return append([]string(nil), u.upgrades...), u.raw.String()
		}
		u.mu.Unlock()
		if time.Now().After(deadline) {
			t.Fatal("the upstream's handlers did not finish")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestUnknownUpgradeRefused checks that no protocol switch but a WebSocket
// is relayed: a guest asking for h2c, TLS, connect-udp or a made-up
// protocol, or asking for nothing, from an upstream that answers 101
// anyway, gets no tunnel, and what it sends next never reaches upstream as
// raw bytes. Before, the 101 was relayed and the bytes went through
// unscrubbed.
func TestUnknownUpgradeRefused(t *testing.T) {
	t.Parallel()
	v, _ := mitmtest.NewGo(t, mitmtest.Rules)
	up := &switchingUpstream{}
	v.UpstreamPlain("plain.test", 80, up)
	v.UpstreamTLS("api.test", 443, v.UpCA, up)
	proxy := v.ProxyListener()
	const marker = "TUNNELLED-BYTES-MUST-NOT-PASS"

	type guest struct {
		name string
		dial func(t *testing.T) (net.Conn, string) // conn, request target
	}
	guests := []guest{
		{"transparent http", func(t *testing.T) (net.Conn, string) { return v.GuestConn("plain.test", 80), "/x" }},
		{"transparent https", func(t *testing.T) (net.Conn, string) {
			tc := tls.Client(v.GuestConn("api.test", 443), &tls.Config{ServerName: "api.test", RootCAs: v.CA.Pool(), NextProtos: []string{"http/1.1"}})
			return tc, "/x"
		}},
		{"explicit proxy", func(t *testing.T) (net.Conn, string) { return dialProxy(t, proxy.Host), "http://plain.test/x" }},
	}
	for _, g := range guests {
		for _, upgrade := range []string{"h2c", "foo", "TLS/1.2", "connect-udp", "websocket, foo", ""} {
			t.Run(g.name+" "+upgrade, func(t *testing.T) {
				conn, target := g.dial(t)
				defer conn.Close()
				host := "plain.test"
				if strings.HasPrefix(g.name, "transparent https") {
					host = "api.test"
				}
				req := fmt.Sprintf("GET %s HTTP/1.1\r\nHost: %s\r\n", target, host)
				if upgrade != "" {
					req += "Connection: Upgrade, HTTP2-Settings\r\nUpgrade: " + upgrade + "\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n"
				}
				fmt.Fprint(conn, req+"\r\n")
				br := bufio.NewReader(conn)
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					t.Fatalf("read the answer: %v", err)
				}
				io.Copy(io.Discard, resp.Body)
				if resp.StatusCode == http.StatusSwitchingProtocols {
					t.Errorf("the proxy relayed a 101 to %q", resp.Header.Get("Upgrade"))
				}
				if resp.StatusCode != http.StatusBadGateway {
					t.Errorf("status %d, want 502", resp.StatusCode)
				}
				conn.Write([]byte(marker))
			})
		}
	}
	v.Events.Wait(t, "refused switch", func(e egress.Event) bool {
		return e.Kind == "request" && strings.Contains(e.Reason, "only a WebSocket upgrade")
	})
	ups, raw := up.seen(t)
	for _, u := range ups {
		if u != "" {
			t.Errorf("upstream saw Upgrade: %q; only websocket may pass", u)
		}
	}
	if strings.Contains(raw, marker) {
		t.Errorf("bytes sent after a refused switch reached upstream: %q", raw)
	}
}

// TestH2ExtendedConnectRefused checks that an HTTP/2 guest cannot open a
// tunnel with extended CONNECT (RFC 8441 WebSocket, RFC 9298 connect-udp):
// the stream is refused and nothing reaches the upstream.
func TestH2ExtendedConnectRefused(t *testing.T) {
	t.Parallel()
	v, _ := mitmtest.NewGo(t, mitmtest.Rules)
	up := &switchingUpstream{}
	v.UpstreamTLS("api.test", 443, v.UpCA, up)
	for _, proto := range []string{"websocket", "connect-udp", "foo"} {
		t.Run(proto, func(t *testing.T) {
			tc := tls.Client(v.GuestConn("api.test", 443), &tls.Config{ServerName: "api.test", RootCAs: v.CA.Pool(), NextProtos: []string{"h2"}})
			defer tc.Close()
			if err := tc.HandshakeContext(t.Context()); err != nil {
				t.Fatal(err)
			}
			io.WriteString(tc, http2.ClientPreface)
			fr := http2.NewFramer(tc, tc)
			fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
			fr.WriteSettings()
			var hb strings.Builder
			enc := hpack.NewEncoder(&hb)
			for _, h := range [][2]string{{":method", "CONNECT"}, {":protocol", proto}, {":scheme", "https"},
				{":authority", "api.test"}, {":path", "/tunnel"}} {
				enc.WriteField(hpack.HeaderField{Name: h[0], Value: h[1]})
			}
			fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: []byte(hb.String()), EndHeaders: true})
			fr.WriteData(1, false, []byte("TUNNELLED-BYTES-MUST-NOT-PASS"))
			tc.SetReadDeadline(time.Now().Add(20 * time.Second))
			for {
				f, err := fr.ReadFrame()
				if err != nil {
					t.Fatalf("no answer to stream 1: %v", err)
				}
				if f.Header().StreamID != 1 {
					if s, ok := f.(*http2.SettingsFrame); ok && !s.IsAck() {
						fr.WriteSettingsAck()
					}
					continue
				}
				if h, ok := f.(*http2.MetaHeadersFrame); ok {
					if st := h.PseudoValue("status"); st == "200" || st == "101" {
						t.Fatalf("extended CONNECT %s answered %s", proto, st)
					}
					return
				}
				if _, ok := f.(*http2.RSTStreamFrame); ok {
					return
				}
			}
		})
	}
	if ups, _ := up.seen(t); len(ups) != 0 {
		t.Errorf("the upstream saw %d requests", len(ups))
	}
}
