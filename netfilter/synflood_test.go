package netfilter

import (
	"github.com/vibedom/vibedom/netfilter/egress"
	"github.com/vibedom/vibedom/netfilter/internal/mitmtest"
	"github.com/vibedom/vibedom/netfilter/internal/stacktest"
	"github.com/vibedom/vibedom/netfilter/netstack"

	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// engineNet is a stack with a real engine behind it; vm is the guest's
// end of the link.
type engineNet struct {
	stack *netstack.Stack
	vm    net.Conn
}

// startEngineNet serves a stack with eng behind it on one end of a socket
// pair, its events to sink and its log to log (nil: none); the guest's end
// is n.vm.
func startEngineNet(t testing.TB, cfg netstack.StackConfig, pol egress.StackPolicy, eng netstack.Engine, sink egress.EventSink, log *slog.Logger) *engineNet {
	t.Helper()
	host, vmFile, err := netstack.SocketPair()
	if err != nil {
		t.Fatal(err)
	}
	s, err := netstack.NewStack(cfg, eng, pol, sink, log)
	if err != nil {
		t.Fatal(err)
	}
	return &engineNet{stack: s, vm: stacktest.Serve(t, host, vmFile, s.Serve)}
}

// guest plays the guest on the VM's end of the link.
func (n *engineNet) guest(t testing.TB) *stacktest.Guest {
	link, read := netstack.NewLink(n.vm, uint32(n.stack.Config().MTU), tcpip.LinkAddress(stacktest.GuestHW))
	return stacktest.NewGuest(t, n.vm, link, read)
}

// rstDropConn is the guest's end of the link with the guest's RSTs from
// source ports lo to hi-1 dropped, as a guest firewall would drop them:
// the SYN-ACKs answering a flood from those ports then go unanswered.
type rstDropConn struct {
	net.Conn
	lo, hi uint16
}

func (c *rstDropConn) Write(b []byte) (int, error) {
	if ip := stacktest.IPv4Of(b); ip != nil && ip.Protocol() == uint8(header.TCPProtocolNumber) {
		h := header.TCP(ip.Payload())
		if len(h) >= header.TCPMinimumSize && h.Flags().Contains(header.TCPFlagRst) &&
			h.SourcePort() >= c.lo && h.SourcePort() < c.hi {
			return len(b), nil
		}
	}
	return c.Conn.Write(b)
}

// TestStackSYNFloodRecovers floods an allowed name's ports 443 and 80 with
// SYNs whose SYN-ACKs the guest never answers, until every handshake slot
// (MaxInFlight) is taken, then checks that the guest's egress comes back:
// an ordinary HTTPS request is served within seconds, on both engines.
// Half-open handshakes used to keep their slots for gVisor's whole SYN-ACK
// retransmission schedule (127 s), dropping every new SYN meanwhile.
func TestStackSYNFloodRecovers(t *testing.T) {
	t.Parallel()
	forEngines(t, func(t *testing.T, kind string) {
		v := newEngineEnv(t, kind, mitmtest.Rules)
		v.UpstreamTLS("api.test", 443, v.UpCA, http.HandlerFunc(mitmtest.EchoInfo))
		const inFlight, flood, firstPort = 64, 256, 1024
		// Half-open handshakes are aborted after 1 s rather than the
		// default 5 s, so the test waits for recovery, not for the default.
		n := startEngineNet(t, netstack.StackConfig{MaxInFlight: inFlight, HandshakeTimeout: time.Second}, v.Policy, v.Eng, nil, nil)
		// The guest's own connections use ephemeral ports (16000 and up),
		// outside the flood's.
		n.vm = &rstDropConn{Conn: n.vm, lo: firstPort, hi: firstPort + flood}
		g := n.guest(t)
		api, ok := stacktest.AnswerA(g.Lookup(t, "api.test.", dnsmessage.TypeA))
		if !ok {
			t.Fatal("api.test: no A record")
		}
		get := func(ctx context.Context) error {
			c := &http.Client{Transport: &http.Transport{
				DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
					return g.Dial(ctx, netip.AddrPortFrom(api, 443))
				},
				TLSClientConfig:   &tls.Config{RootCAs: v.CA.Pool()},
				DisableKeepAlives: true,
			}}
			req, _ := http.NewRequestWithContext(ctx, "GET", "https://api.test/after", nil)
			resp, err := c.Do(req)
			if err != nil {
				return err
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || string(b) != "hello from api.test /after" {
				return fmt.Errorf("got %d %q", resp.StatusCode, b)
			}
			return nil
		}
		if err := get(t.Context()); err != nil {
			t.Fatalf("before the flood: %v", err)
		}

		for i := range flood {
			dst := netip.AddrPortFrom(api, []uint16{443, 80}[i%2])
			src := netip.AddrPortFrom(stacktest.GuestIP, uint16(firstPort+i))
			if _, err := n.vm.Write(stacktest.GuestIPFrame(stacktest.GuestIP, api, uint8(header.TCPProtocolNumber), stacktest.TCPSYN(src, dst, uint32(i)))); err != nil {
				t.Fatal(err)
			}
		}
		for deadline := time.Now().Add(30 * time.Second); n.stack.Stats().HandshakeDrops == 0; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the flood never took every handshake slot (MaxInFlight %d)", inFlight)
			}
		}

		// Generous for a loaded machine, and well short of the 127 s the
		// slots used to stay taken.
		ctx, cancel := context.WithTimeout(t.Context(), 45*time.Second)
		defer cancel()
		for {
			attempt, stop := context.WithTimeout(ctx, 10*time.Second)
			err := get(attempt)
			stop()
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("egress still dead after the flood: %v (ConnsOpen %d)", err, n.stack.Stats().ConnsOpen)
			}
		}
	})
}
