package netstack

import (
	"errors"
	"net"
	"os"
	"syscall"
	"time"
)

// frameIO moves whole frames over a connected datagram socket, one frame
// per datagram, in batches where the platform can.
type frameIO interface {
	// read blocks until at least one datagram arrives and returns the
	// datagrams read, valid until the next read. A datagram longer than
	// the link's frame size is returned longer than that size (possibly
	// truncated), for the caller to drop.
	read() ([][]byte, error)
	// write sends each frame as one datagram, in order, and returns how
	// many were sent.
	write(frames [][]byte) (int, error)
}

// connIO is the portable frameIO: one system call per datagram. On macOS
// a write may fail with ENOBUFS when the socket's buffer is momentarily
// full instead of blocking; it is retried for about 10 ms before the frame
// is dropped (TCP recovers).
type connIO struct {
	c    net.Conn
	buf  []byte
	out  [][]byte
	wait func(time.Duration)
}

func newConnIO(c net.Conn, frameSize int) *connIO {
	return &connIO{c: c, buf: make([]byte, frameSize+1), out: make([][]byte, 1), wait: time.Sleep}
}

func (c *connIO) read() ([][]byte, error) {
	n, err := c.c.Read(c.buf)
	if err != nil {
		return nil, err
	}
	c.out[0] = c.buf[:n]
	return c.out, nil
}

func (c *connIO) write(frames [][]byte) (int, error) {
	for i, f := range frames {
		if err := c.writeOne(f); err != nil {
			if isFrameError(err) {
				continue // this frame only: drop it
			}
			return i, err
		}
	}
	return len(frames), nil
}

func (c *connIO) writeOne(f []byte) error {
	delay := 20 * time.Microsecond
	for try := 0; ; try++ {
		_, err := c.c.Write(f)
		if err == nil || !errors.Is(err, syscall.ENOBUFS) || try >= 12 {
			return err
		}
		c.wait(delay)
		delay = min(2*delay, 2*time.Millisecond)
	}
}

// isFrameError reports errors that concern one datagram (too big for the
// socket) rather than the socket.
func isFrameError(err error) bool {
	return errors.Is(err, syscall.EMSGSIZE)
}

// isTimeout reports a deadline error.
func isTimeout(err error) bool {
	return errors.Is(err, os.ErrDeadlineExceeded)
}
