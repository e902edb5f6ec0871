package egress

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// ConnSlots bounds a session's open upstream connections.
type ConnSlots struct {
	sem   chan struct{}
	Open  atomic.Int64
	Peak  atomic.Int64
	flush func() // closes idle pooled connections to free slots
}

// NewConnSlots bounds open upstream connections to n; flush closes idle
// pooled connections when none is free.
func NewConnSlots(n int, flush func()) *ConnSlots {
	return &ConnSlots{sem: make(chan struct{}, n), flush: flush}
}

// acquire waits for a slot (closing idle pooled connections first when
// none is free) until ctx ends or upstreamSlotWait passes.
func (s *ConnSlots) acquire(ctx context.Context) error {
	select {
	case s.sem <- struct{}{}:
		s.opened()
		return nil
	default:
	}
	if s.flush != nil {
		s.flush()
	}
	t := time.NewTimer(upstreamSlotWait)
	defer t.Stop()
	select {
	case s.sem <- struct{}{}:
		s.opened()
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return fmt.Errorf("too many upstream connections open (%d) in this session; close some and retry", cap(s.sem))
	}
}

func (s *ConnSlots) opened() {
	n := s.Open.Add(1)
	for {
		p := s.Peak.Load()
		if n <= p || s.Peak.CompareAndSwap(p, n) {
			return
		}
	}
}

func (s *ConnSlots) release() {
	s.Open.Add(-1)
	<-s.sem
}

// slotConn gives its slot back when closed.
type slotConn struct {
	net.Conn
	once  sync.Once
	slots *ConnSlots
}

func (c *slotConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.slots.release)
	return err
}

// SyscallConn exposes the socket, when there is one, so the upstream
// reader can still read it directly.
func (c *slotConn) SyscallConn() (syscall.RawConn, error) {
	if sc, ok := c.Conn.(syscall.Conn); ok {
		return sc.SyscallConn()
	}
	return nil, errors.New("no socket under this connection")
}

func (c *slotConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// upstreamSlotWait is how long a dial waits for a free upstream
// connection slot before it fails.
const upstreamSlotWait = 15 * time.Second
