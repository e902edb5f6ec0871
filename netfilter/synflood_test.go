package netfilter

import (
	"github.com/vibedom/vibedom/netfilter/egress"

	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// startEngineNet serves a stack with eng behind it on one end of a socket
// pair; the guest's end is n.vm.
func startEngineNet(t testing.TB, cfg StackConfig, pol egress.StackPolicy, eng Engine) *nsNet {
	t.Helper()
	n := &nsNet{events: &nsEvents{}}
	host, vmFile, err := SocketPair()
	if err != nil {
		t.Fatal(err)
	}
	vm, err := net.FileConn(vmFile)
	vmFile.Close()
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewStack(cfg, eng, pol, n.events, nil)
	if err != nil {
		t.Fatal(err)
	}
	n.stack, n.vm = s, vm
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, host) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
		host.Close()
		vm.Close()
	})
	return n
}

// rstDropConn is the guest's end of the link with the guest's RSTs from
// source ports lo to hi-1 dropped, as a guest firewall would drop them:
// the SYN-ACKs answering a flood from those ports then go unanswered.
type rstDropConn struct {
	net.Conn
	lo, hi uint16
}

func (c *rstDropConn) Write(b []byte) (int, error) {
	if ip := ipv4Of(b); ip != nil && ip.Protocol() == uint8(protoTCP) {
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
	forEngines(t, func(t *testing.T, kind string) {
		v := newEngineEnv(t, kind, testRules)
		v.upstreamTLS("api.test", 443, v.upCA, http.HandlerFunc(echoInfo))
		const inFlight, flood, firstPort = 64, 256, 1024
		n := startEngineNet(t, StackConfig{MaxInFlight: inFlight}, v.policy, v.eng)
		// The guest's own connections use ephemeral ports (16000 and up),
		// outside the flood's.
		n.vm = &rstDropConn{Conn: n.vm, lo: firstPort, hi: firstPort + flood}
		g := n.guest(t)
		api, ok := answerA(g.lookup(t, "api.test.", dnsmessage.TypeA))
		if !ok {
			t.Fatal("api.test: no A record")
		}
		get := func(ctx context.Context) error {
			c := &http.Client{Transport: &http.Transport{
				DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
					return g.dial(ctx, netip.AddrPortFrom(api, 443))
				},
				TLSClientConfig:   &tls.Config{RootCAs: v.ca.Pool()},
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
			src := netip.AddrPortFrom(testGuestIP, uint16(firstPort+i))
			if _, err := n.vm.Write(guestIPFrame(testGuestIP, api, protoTCP, tcpSYN(src, dst, uint32(i)))); err != nil {
				t.Fatal(err)
			}
		}
		drops := n.stack.st.Stats().TCP.ForwardMaxInFlightDrop
		for deadline := time.Now().Add(30 * time.Second); drops.Value() == 0; time.Sleep(10 * time.Millisecond) {
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
