package mitm

import (
	"crypto/tls"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
)

// Streaming a response body costs the proxy, per 16 KB TLS record, a read
// from upstream and a record written to the guest, and most of the
// kernel's cost of a loopback or local socket is per call, not per byte.
// So an HTTP/1 guest connection gathers the records of a body while more
// of it is at hand and writes them in one call (batchConn), and the
// upstream connection reads whatever has arrived in one call and, when it
// is about to wait, has the guest's batch written out (upstreamConn):
// nothing is held back while the proxy waits, so streamed events are not
// delayed.

// batchMax is the most a batchConn gathers before it writes: four TLS
// records of the largest size (16 KB of plaintext, 256 bytes of expansion,
// 5 of header).
const batchMax = 4 * (16<<10 + 256 + 5)

var batchBufs = sync.Pool{New: func() any { b := make([]byte, 0, batchMax); return &b }}

// batchConn is a guest connection that can gather writes. Writes go
// straight through unless hold is on; while it is, they are gathered up to
// batchMax bytes and written in one piece when the buffer is full or hold
// goes off. A write error is kept and returned by every later Write.
type batchConn struct {
	net.Conn
	mu   sync.Mutex
	hold bool
	buf  *[]byte
	err  error
	// npending is len(*buf), readable without mu.
	npending atomic.Int64
	flushing atomic.Bool // a flushSoon goroutine has not yet taken mu
}

func (c *batchConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return 0, c.err
	}
	if !c.hold {
		n, err := c.Conn.Write(p)
		c.err = err
		return n, err
	}
	if c.buf == nil {
		c.buf = batchBufs.Get().(*[]byte)
	}
	if len(*c.buf)+len(p) > batchMax {
		if c.writeBuf(); c.err != nil {
			return 0, c.err
		}
	}
	if len(p) >= batchMax {
		n, err := c.Conn.Write(p)
		c.err = err
		return n, err
	}
	*c.buf = append(*c.buf, p...)
	c.npending.Store(int64(len(*c.buf)))
	return len(p), nil
}

// writeBuf writes what is gathered and empties the buffer.
func (c *batchConn) writeBuf() {
	if len(*c.buf) > 0 && c.err == nil {
		_, c.err = c.Conn.Write(*c.buf)
	}
	*c.buf = (*c.buf)[:0]
	c.npending.Store(0)
}

// flushLocked writes what is gathered and returns the buffer to the pool.
func (c *batchConn) flushLocked() {
	if c.buf == nil {
		return
	}
	c.writeBuf()
	batchBufs.Put(c.buf)
	c.buf = nil
}

// pending reports whether writes are gathered and not yet written.
func (c *batchConn) pending() bool { return c.npending.Load() > 0 }

// flushSoon has what is gathered written by a goroutine of its own (one at
// a time); hold stays as it is.
func (c *batchConn) flushSoon() {
	if !c.flushing.CompareAndSwap(false, true) {
		return // one is on its way; it writes whatever is gathered by then
	}
	go func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.flushing.Store(false)
		c.flushLocked()
	}()
}

// setHold turns gathering on or off; off writes what is gathered.
func (c *batchConn) setHold(on bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.hold = on
	if !on {
		c.flushLocked()
	}
}

// Close closes the connection; anything still gathered is dropped. (It
// must not wait for mu: tls.Conn.Close calls it to break a Write that is
// blocked holding mu.)
func (c *batchConn) Close() error {
	return c.Conn.Close()
}

// CloseWrite writes what is gathered and half-closes the underlying
// connection when it can.
func (c *batchConn) CloseWrite() error {
	c.setHold(false)
	return closeWrite(c.Conn)
}

// upstreamConn is an HTTP/1 upstream connection tuned for streaming
// bodies to a batching guest connection:
//
//   - when a read is about to wait, it has what the guest it serves has
//     gathered written out (flushSoon), so the guest never waits for bytes
//     the proxy holds while the proxy waits for upstream;
//   - it reads up to upReadMax bytes at a time into a pooled buffer (held
//     only while it has unread bytes), fetching what a server sent in many
//     small writes with one read(2).
//
// It needs the descriptor (syscall.Conn); wrapUpstream leaves other
// connections as they are, and their guests are never batched. Read is not
// safe for concurrent use (neither tls.Conn nor the HTTP transport reads
// concurrently).
type upstreamConn struct {
	net.Conn
	rc    syscall.RawConn
	guest atomic.Pointer[batchConn] // flushed when a read waits
	buf   *[]byte                   // read but not yet returned: (*buf)[off:]
	off   int
}

const upReadMax = 256 << 10

var upReadBufs = sync.Pool{New: func() any { b := make([]byte, upReadMax); return &b }}

// wrapUpstream wraps c when it can.
func wrapUpstream(c net.Conn) net.Conn {
	if !canReadFD {
		return c
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return c
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return c
	}
	return &upstreamConn{Conn: c, rc: rc}
}

// asUpstream returns the upstreamConn under c (a *tls.Conn or the
// connection itself), or nil.
func asUpstream(c net.Conn) *upstreamConn {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	uc, _ := c.(*upstreamConn)
	return uc
}

func (c *upstreamConn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if c.buf == nil {
		if err := c.fill(); err != nil {
			return 0, err
		}
	}
	n := copy(p, (*c.buf)[c.off:])
	c.off += n
	if c.off == len(*c.buf) {
		*c.buf = (*c.buf)[:cap(*c.buf)]
		upReadBufs.Put(c.buf)
		c.buf, c.off = nil, 0
	}
	return n, nil
}

// fill reads at least one byte into a fresh c.buf, or returns an error
// (io.EOF at the end) with c.buf nil.
func (c *upstreamConn) fill() error {
	var (
		b    *[]byte
		n    int
		rerr error
	)
	err := c.rc.Read(func(fd uintptr) bool {
		if b == nil {
			b = upReadBufs.Get().(*[]byte)
		}
		var again bool
		n, again, rerr = readFD(fd, *b)
		if again {
			// About to wait: hold no buffer meanwhile, and have what the
			// guest is owed written out (by another goroutine, so that
			// neither this read nor the next response on this connection
			// waits for a slow guest).
			upReadBufs.Put(b)
			b = nil
			if g := c.guest.Load(); g != nil && g.pending() {
				g.flushSoon()
			}
			return false
		}
		return true
	})
	if err == nil && rerr == nil && n > 0 {
		*b = (*b)[:n]
		c.buf, c.off = b, 0
		return nil
	}
	if b != nil {
		upReadBufs.Put(b)
	}
	switch {
	case err != nil:
		return c.opError(err)
	case rerr != nil:
		return c.opError(rerr)
	default:
		return io.EOF
	}
}

func (c *upstreamConn) opError(err error) error {
	return &net.OpError{Op: "read", Net: c.LocalAddr().Network(), Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
}
