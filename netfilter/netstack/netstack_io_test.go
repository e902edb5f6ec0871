package netstack

import (
	"github.com/vibedom/vibedom/netfilter/internal/stacktest"

	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// nsPlainConn hides the socket's descriptor, so the link falls back to one
// read or write per frame (the macOS path).
type nsPlainConn struct{ net.Conn }

// TestStackPortableIO runs DNS and a TCP echo over the portable frame I/O.
func TestStackPortableIO(t *testing.T) {
	t.Parallel()
	host, vmFile, err := SocketPair()
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	vm, err := net.FileConn(vmFile)
	vmFile.Close()
	if err != nil {
		t.Fatal(err)
	}
	defer vm.Close()
	eng := newNSEngine()
	res := &stacktest.Resolver{Known: map[string]bool{"api.example.com": true}}
	s, err := NewStack(StackConfig{Resolver: res}, eng, testPolicyAllow(), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := newFrameIO(nsPlainConn{host}, 1514).(*connIO); !ok {
		t.Fatal("a conn without a descriptor did not get the portable I/O")
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, nsPlainConn{host}) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	}()
	n := &nsNet{stack: s, engine: eng, vm: nsPlainConn{vm}}
	g := n.guest(t)
	a, ok := stacktest.AnswerA(g.Lookup(t, "api.example.com.", dnsmessage.TypeA))
	if !ok {
		t.Fatal("no answer")
	}
	c, err := g.Dial(t.Context(), netip.AddrPortFrom(a, 443))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	msg := make([]byte, 256<<10) // many frames each way
	for i := range msg {
		msg[i] = byte(i)
	}
	go c.Write(msg)
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatalf("echo: %v", err)
	}
	for i := range got {
		if got[i] != msg[i] {
			t.Fatalf("echo differs at byte %d", i)
		}
	}
}

// nobufsConn fails the first fails writes with ENOBUFS, as macOS does when
// a datagram socket's buffer is full.
type nobufsConn struct {
	net.Conn
	fails  int
	writes [][]byte
}

func (c *nobufsConn) Write(b []byte) (int, error) {
	if c.fails > 0 {
		c.fails--
		return 0, &net.OpError{Op: "write", Err: os.NewSyscallError("write", syscall.ENOBUFS)}
	}
	c.writes = append(c.writes, append([]byte(nil), b...))
	return len(b), nil
}

func TestConnIORetriesENOBUFS(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		fails     int
		wantSent  int
		wantErr   bool
		wantWrote int
	}{
		{"no error", 0, 2, false, 2},
		{"a few ENOBUFS are retried", 3, 2, false, 2},
		{"persistent ENOBUFS gives up", 1000, 0, true, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &nobufsConn{fails: tt.fails}
			io := newConnIO(c, 1514)
			var slept time.Duration
			io.wait = func(d time.Duration) { slept += d }
			sent, err := io.write([][]byte{[]byte("frame one"), []byte("frame two")})
			if sent != tt.wantSent || (err != nil) != tt.wantErr || len(c.writes) != tt.wantWrote {
				t.Errorf("got sent %d, err %v, %d writes; want %d, error %v, %d writes", sent, err, len(c.writes), tt.wantSent, tt.wantErr, tt.wantWrote)
			}
			if tt.wantErr && !errors.Is(err, syscall.ENOBUFS) {
				t.Errorf("error: got %v, want ENOBUFS", err)
			}
			if slept > 50*time.Millisecond {
				t.Errorf("backed off %v in all, want a short retry", slept)
			}
		})
	}
}
