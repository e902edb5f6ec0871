package netfilter

import (
	"github.com/vibedom/vibedom/netfilter/netstack"

	"context"
	"net"
	"net/netip"
)

// ConnTap observes the bytes of one transparently intercepted guest
// connection (the SSH agent uses it to learn the key exchange of the SSH
// connections the host carries). Its methods are called from the
// connection's goroutines and must not block for long.
type ConnTap interface {
	// FromGuest sees bytes the guest sent, before the engine reads them.
	FromGuest(p []byte)
	// ToGuest sees bytes the engine writes to the guest, before they are
	// written.
	ToGuest(p []byte)
	// Close is called once, after the engine is done with the connection.
	Close()
}

// TapEngine returns an Engine that serves connections with inner, showing
// the bytes of each transparently intercepted connection to the ConnTap
// tap returns for its target (nil: that connection is not tapped). The
// explicit proxy's connections are not tapped.
func TapEngine(inner netstack.Engine, tap func(netstack.Target) ConnTap) netstack.Engine {
	return &tapEngine{inner: inner, tap: tap}
}

type tapEngine struct {
	inner netstack.Engine
	tap   func(netstack.Target) ConnTap
}

func (e *tapEngine) HandleConn(ctx context.Context, conn net.Conn, t netstack.Target) {
	if t.Decision.Allow {
		if ct := e.tap(t); ct != nil {
			defer ct.Close()
			conn = &tapConn{Conn: conn, tap: ct}
		}
	}
	e.inner.HandleConn(ctx, conn, t)
}

func (e *tapEngine) HandleProxyConn(ctx context.Context, conn net.Conn, src netip.AddrPort) {
	e.inner.HandleProxyConn(ctx, conn, src)
}

// tapConn shows what is read and written to its tap.
type tapConn struct {
	net.Conn
	tap ConnTap
}

func (c *tapConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.tap.FromGuest(p[:n])
	}
	return n, err
}

func (c *tapConn) Write(p []byte) (int, error) {
	c.tap.ToGuest(p)
	return c.Conn.Write(p)
}

func (c *tapConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
