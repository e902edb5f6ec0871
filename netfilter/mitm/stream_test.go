package mitm

import (
	"github.com/vibedom/vibedom/netfilter/internal/nftest"

	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// writeLog is a net.Conn that records the writes it is given; only Write
// and Close are implemented. After failAt writes every write fails.
type writeLog struct {
	net.Conn
	mu     sync.Mutex
	writes [][]byte
	failAt int // 0: never
	wrote  chan struct{}
}

var errWriteLog = errors.New("write refused")

func newWriteLog() *writeLog { return &writeLog{wrote: make(chan struct{}, 100)} }

func (w *writeLog) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.failAt > 0 && len(w.writes) >= w.failAt {
		return 0, errWriteLog
	}
	w.writes = append(w.writes, bytes.Clone(p))
	select {
	case w.wrote <- struct{}{}:
	default:
	}
	return len(p), nil
}

func (w *writeLog) Close() error { return nil }

// sizes returns the length of every write so far.
func (w *writeLog) sizes() []int {
	w.mu.Lock()
	defer w.mu.Unlock()
	var s []int
	for _, b := range w.writes {
		s = append(s, len(b))
	}
	return s
}

func (w *writeLog) joined() []byte {
	w.mu.Lock()
	defer w.mu.Unlock()
	return bytes.Join(w.writes, nil)
}

func TestBatchConn(t *testing.T) {
	t.Parallel()
	rec := func(n int) []byte { return bytes.Repeat([]byte{byte('a' + n%26)}, 16406) }
	tests := []struct {
		name      string
		hold      bool
		writes    int
		wantSizes []int // before hold goes off
		wantAfter []int // after
	}{
		{"hold off passes every write", false, 3, []int{16406, 16406, 16406}, []int{16406, 16406, 16406}},
		{"hold gathers until off", true, 3, nil, []int{3 * 16406}},
		{"hold writes a full batch", true, 9, []int{4 * 16406, 4 * 16406}, []int{4 * 16406, 4 * 16406, 16406}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wl := newWriteLog()
			c := &batchConn{Conn: wl}
			c.setHold(tt.hold)
			var want []byte
			for i := range tt.writes {
				if n, err := c.Write(rec(i)); n != 16406 || err != nil {
					t.Fatalf("write %d: %d, %v", i, n, err)
				}
				want = append(want, rec(i)...)
			}
			if got := wl.sizes(); !equalInts(got, tt.wantSizes) {
				t.Errorf("writes while held: got %v, want %v", got, tt.wantSizes)
			}
			if c.pending() != (tt.hold && tt.writes%4 != 0) {
				t.Errorf("pending: got %v", c.pending())
			}
			c.setHold(false)
			if got := wl.sizes(); !equalInts(got, tt.wantAfter) {
				t.Errorf("writes after hold: got %v, want %v", got, tt.wantAfter)
			}
			if !bytes.Equal(wl.joined(), want) {
				t.Errorf("bytes written differ from bytes given (order or content)")
			}
		})
	}
	t.Run("write error is kept", func(t *testing.T) {
		wl := newWriteLog()
		wl.failAt = 1
		c := &batchConn{Conn: wl}
		c.setHold(true)
		for i := range 5 {
			c.Write(rec(i)) // the fifth fills the batch and writes it
		}
		c.Write(rec(5))
		c.setHold(false) // the second batch write fails
		if _, err := c.Write([]byte("x")); !errors.Is(err, errWriteLog) {
			t.Errorf("write after a failed batch: got %v, want %v", err, errWriteLog)
		}
	})
}

func equalInts(a, b []int) bool {
	return fmt.Sprint(a) == fmt.Sprint(b)
}

func TestUpstreamConnReads(t *testing.T) {
	t.Parallel()
	if !canReadFD {
		t.Skip("upstream connections are not wrapped on this platform")
	}
	c, s := nftest.TCPPair(t)
	uc, ok := wrapUpstream(c).(*upstreamConn)
	if !ok {
		t.Fatal("a TCP connection was not wrapped")
	}
	if p1, _ := net.Pipe(); wrapUpstream(p1) != p1 {
		t.Error("a connection without a descriptor was wrapped")
	}
	// More than one read buffer, in writes of assorted sizes.
	var want []byte
	for i := range 300 {
		want = append(want, bytes.Repeat([]byte{byte(i)}, 1+i*37%5000)...)
	}
	want = append(want, bytes.Repeat([]byte("z"), upReadMax+123)...)
	go func() {
		b := want
		for i := 0; len(b) > 0; i++ {
			n := min(len(b), 1+i*7919%70000)
			s.Write(b[:n])
			b = b[n:]
		}
		s.Close()
	}()
	var got []byte
	buf := make([]byte, 3000)
	for {
		n, err := uc.Read(buf)
		got = append(got, buf[:n]...)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("read %d bytes, want %d (or content differs)", len(got), len(want))
	}
	uc.Close()
	if _, err := uc.Read(buf); !errors.Is(err, net.ErrClosed) {
		t.Errorf("read after close: got %v, want net.ErrClosed", err)
	}
}

// An upstream read that waits has the guest sent what it holds.
func TestUpstreamConnFlushesGuestWhileWaiting(t *testing.T) {
	t.Parallel()
	if !canReadFD {
		t.Skip("upstream connections are not wrapped on this platform")
	}
	c, s := nftest.TCPPair(t)
	uc := wrapUpstream(c).(*upstreamConn)
	wl := newWriteLog()
	guest := &batchConn{Conn: wl}
	guest.setHold(true)
	guest.Write([]byte("held"))
	uc.guest.Store(guest)
	got := make(chan string, 1)
	go func() {
		b := make([]byte, 10)
		n, err := uc.Read(b)
		if err != nil {
			got <- err.Error()
		}
		got <- string(b[:n])
	}()
	select {
	case <-wl.wrote:
	case <-time.After(20 * time.Second):
		t.Fatal("the guest's held bytes were not written while upstream was silent")
	}
	if string(wl.joined()) != "held" {
		t.Errorf("guest got %q, want %q", wl.joined(), "held")
	}
	s.Write([]byte("data"))
	if g := <-got; g != "data" {
		t.Errorf("upstream read: got %q, want %q", g, "data")
	}
}
