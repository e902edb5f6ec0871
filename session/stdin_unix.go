//go:build unix

package session

import (
	"errors"
	"io"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// cancelableInput reads f only when it has data, so that stopping it never
// leaves a read pending that would swallow the user's next keystroke (the
// review prompt reads the same terminal after the session).
type cancelableInput struct {
	fd   int
	once sync.Once
	done chan struct{}
}

// newInput wraps r; stop ends reads. Readers that are not files are
// returned as they are.
func newInput(r io.Reader) (io.Reader, func()) {
	f, ok := r.(*os.File)
	if !ok {
		return r, func() {}
	}
	c := &cancelableInput{fd: int(f.Fd()), done: make(chan struct{})}
	return c, func() { c.once.Do(func() { close(c.done) }) }
}

func (c *cancelableInput) Read(p []byte) (int, error) {
	fds := []unix.PollFd{{Fd: int32(c.fd), Events: unix.POLLIN}}
	for {
		select {
		case <-c.done:
			return 0, io.EOF
		default:
		}
		fds[0].Revents = 0
		n, err := unix.Poll(fds, 100)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return 0, err
		}
		if n == 0 {
			continue
		}
		select {
		case <-c.done:
			return 0, io.EOF
		default:
		}
		m, err := unix.Read(c.fd, p)
		if err != nil {
			if errors.Is(err, unix.EINTR) || errors.Is(err, unix.EAGAIN) {
				continue
			}
			return 0, err
		}
		if m == 0 {
			return 0, io.EOF
		}
		return m, nil
	}
}
