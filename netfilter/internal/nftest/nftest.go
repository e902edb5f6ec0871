// Package nftest is test support shared by the tests of netfilter and its
// rooms (egress, the network stack, the engines): loopback listeners that
// count what reaches them, a host without addresses, a silent logger, a
// loopback TCP pair, hand-made TLS ClientHellos, probes that skip a test
// when a program it needs is missing. It is imported only by tests and
// holds no test of its own; it imports none of the netfilter rooms, so any
// of their tests may use it.
package nftest

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// DiscardLog is a logger that writes nothing.
var DiscardLog = slog.New(slog.DiscardHandler)

// NoHostAddrs is a HostAddrs function for a host with no addresses of its own.
func NoHostAddrs() ([]netip.Addr, error) { return nil, nil }

// CountedListener counts the connections it accepts (and closes them).
type CountedListener struct {
	net.Listener
	Count atomic.Int64
}

// CountingListener is a CountedListener on a free loopback port.
func CountingListener(t *testing.T) *CountedListener {
	t.Helper()
	return CountingListenerOn(t, "127.0.0.1:0")
}

// CountingListenerOn is a CountedListener on addr, closed when the test ends.
func CountingListenerOn(t *testing.T, addr string) *CountedListener {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	cl := &CountedListener{Listener: ln}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			cl.Count.Add(1)
			c.Close()
		}
	}()
	return cl
}

// WaitCount waits until the listener has accepted n connections.
func (l *CountedListener) WaitCount(t *testing.T, n int64) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for l.Count.Load() < n {
		if time.Now().After(deadline) {
			t.Fatalf("listener accepted %d connections, want %d", l.Count.Load(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (l *CountedListener) Port() string {
	_, p, _ := net.SplitHostPort(l.Addr().String())
	return p
}

// TCPPair returns the two ends of a loopback TCP connection.
func TCPPair(t testing.TB) (client, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type res struct {
		c   net.Conn
		err error
	}
	ch := make(chan res, 1)
	go func() { c, err := ln.Accept(); ch <- res{c, err} }()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	r := <-ch
	if r.err != nil {
		t.Fatal(r.err)
	}
	return client, r.c
}

// Probe is a check of the machine a test needs (a program installed, at a
// supported version), run once however many tests ask.
type Probe struct {
	what    string
	version func(ctx context.Context, program string) (string, error)
	needs   []*Probe
	once    sync.Once
	err     error
}

// VersionProbe returns a Probe that a test passes when version (a version
// check such as mitmproxy.MitmdumpVersion, run on the default program)
// succeeds and every probe it needs passes; what names what goes untested
// otherwise ("mitmproxy engine not tested").
func VersionProbe(what string, version func(ctx context.Context, program string) (string, error), needs ...*Probe) *Probe {
	return &Probe{what: what, version: version, needs: needs}
}

// Skip skips t, with the reason, when a probe p needs or p's own check
// fails.
func (p *Probe) Skip(t testing.TB) {
	t.Helper()
	for _, n := range p.needs {
		n.Skip(t)
	}
	p.once.Do(func() { _, p.err = p.version(context.Background(), "") })
	if p.err != nil {
		t.Skipf("%s: %v", p.what, p.err)
	}
}
