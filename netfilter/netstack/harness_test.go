package netstack

import (
	"github.com/vibedom/vibedom/netfilter/egress"
	"github.com/vibedom/vibedom/netfilter/internal/stacktest"

	"context"
	"io"
	"net"
	"net/netip"
	"testing"

	"gvisor.dev/gvisor/pkg/tcpip"
)

// nsAccepted is one connection the fake engine was handed.
type nsAccepted struct {
	target Target
	proxy  bool
	src    netip.AddrPort
}

// nsEngine records what it is handed and echoes (or, with discard,
// reads and drops; with send, writes send bytes and closes).
type nsEngine struct {
	got     chan nsAccepted
	discard bool
	send    int64
	hold    chan struct{} // when set, handlers wait for it before closing
}

func newNSEngine() *nsEngine { return &nsEngine{got: make(chan nsAccepted, 1024)} }

func (e *nsEngine) HandleConn(ctx context.Context, conn net.Conn, t Target) {
	defer conn.Close()
	select {
	case e.got <- nsAccepted{target: t}:
	default:
	}
	e.serve(ctx, conn)
}

func (e *nsEngine) HandleProxyConn(ctx context.Context, conn net.Conn, src netip.AddrPort) {
	defer conn.Close()
	select {
	case e.got <- nsAccepted{proxy: true, src: src}:
	default:
	}
	e.serve(ctx, conn)
}

func (e *nsEngine) serve(ctx context.Context, conn net.Conn) {
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	switch {
	case e.hold != nil:
		<-e.hold
	case e.discard:
		_, _ = io.Copy(io.Discard, conn)
	case e.send > 0:
		buf := make([]byte, 64<<10)
		for left := e.send; left > 0; {
			n := int64(len(buf))
			if left < n {
				n = left
			}
			w, err := conn.Write(buf[:n])
			if err != nil {
				return
			}
			left -= int64(w)
		}
	default:
		_, _ = io.Copy(conn, conn)
	}
}

// nsNet is a Stack serving one end of a socket pair; the test holds the
// other end, as the VM would.
type nsNet struct {
	stack    *Stack
	engine   *nsEngine
	events   *stacktest.Events
	resolver *stacktest.Resolver
	vm       net.Conn // the guest's end
}

func startNSNet(t testing.TB, cfg StackConfig, pol egress.StackPolicy, eng *nsEngine) *nsNet {
	t.Helper()
	if eng == nil {
		eng = newNSEngine()
	}
	var resolver *stacktest.Resolver
	if cfg.Resolver == nil {
		resolver = &stacktest.Resolver{Known: map[string]bool{}, Fail: map[string]bool{}}
		cfg.Resolver = resolver
	}
	n := startEngineNet(t, cfg, pol, eng)
	n.engine, n.resolver = eng, resolver
	return n
}

// startEngineNet serves a stack with eng behind it on one end of a socket
// pair; the guest's end is n.vm.
func startEngineNet(t testing.TB, cfg StackConfig, pol egress.StackPolicy, eng Engine) *nsNet {
	t.Helper()
	n := &nsNet{events: &stacktest.Events{}}
	host, vmFile, err := SocketPair()
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewStack(cfg, eng, pol, n.events, nil)
	if err != nil {
		t.Fatal(err)
	}
	n.stack, n.vm = s, stacktest.Serve(t, host, vmFile, s.Serve)
	return n
}

// guest plays the guest on the VM's end of the link.
func (n *nsNet) guest(t testing.TB) *stacktest.Guest {
	link, read := NewLink(n.vm, uint32(n.stack.cfg.MTU), tcpip.LinkAddress(stacktest.GuestHW))
	return stacktest.NewGuest(t, n.vm, link, read)
}
