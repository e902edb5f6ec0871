package netfilter

import (
	"github.com/vibedom/vibedom/netfilter/egress"
	"github.com/vibedom/vibedom/netfilter/netstack"

	"context"
	"io"
	"net"
	"net/netip"
	"sync"
	"testing"
)

type echoEngine struct{}

func (echoEngine) HandleConn(_ context.Context, conn net.Conn, _ netstack.Target) {
	defer conn.Close()
	b := make([]byte, 5)
	io.ReadFull(conn, b)
	conn.Write(append([]byte("re:"), b...))
}

func (echoEngine) HandleProxyConn(context.Context, net.Conn, netip.AddrPort) {}

type recTap struct {
	mu       sync.Mutex
	from, to []byte
	closed   bool
}

func (r *recTap) FromGuest(p []byte) { r.mu.Lock(); r.from = append(r.from, p...); r.mu.Unlock() }
func (r *recTap) ToGuest(p []byte)   { r.mu.Lock(); r.to = append(r.to, p...); r.mu.Unlock() }
func (r *recTap) Close()             { r.mu.Lock(); r.closed = true; r.mu.Unlock() }

// TestTapEngine: an admitted connection's bytes both ways reach the tap
// before the engine is done, and the tap is closed after it; a target the
// tap declines and a refused connection are not tapped.
func TestTapEngine(t *testing.T) {
	t.Parallel()
	var taps []*recTap
	e := TapEngine(echoEngine{}, func(t netstack.Target) ConnTap {
		if t.Port != 22 {
			return nil
		}
		r := &recTap{}
		taps = append(taps, r)
		return r
	})
	for _, tgt := range []netstack.Target{
		{Name: "git.test", Port: 22, Decision: egress.Decision{Allow: true}},
		{Name: "git.test", Port: 2222, Decision: egress.Decision{Allow: true}},
		{Name: "git.test", Port: 22},
	} {
		g, h := net.Pipe()
		done := make(chan struct{})
		go func() { e.HandleConn(context.Background(), h, tgt); close(done) }()
		g.Write([]byte("hello"))
		got, _ := io.ReadAll(g)
		<-done
		if string(got) != "re:hello" {
			t.Errorf("%v: guest got %q", tgt, got)
		}
	}
	if len(taps) != 1 {
		t.Fatalf("%d connections tapped, want 1", len(taps))
	}
	r := taps[0]
	if string(r.from) != "hello" || string(r.to) != "re:hello" || !r.closed {
		t.Errorf("tap saw from %q, to %q, closed %v", r.from, r.to, r.closed)
	}
}
