//go:build unix

package vz

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// Socket buffer sizes TuneDatagramSocket aims for: room for a few hundred
// full-size frames in flight, with SO_RCVBUF four times SO_SNDBUF as Apple
// recommends for a file-handle network attachment.
const (
	wantSndBuf = 1 << 20
	minSndBuf  = 64 << 10
)

// TuneDatagramSocket checks that f is a connected AF_UNIX SOCK_DGRAM socket
// and sizes its buffers the way Virtualization.framework's file-handle
// network attachment expects: SO_RCVBUF at least twice (ideally four times)
// SO_SNDBUF, as large as the system allows up to 1 MiB of send buffer.
//
// Start calls it on vm.Network.Conn, the machine's end of the socket pair.
// The caller should call it on its own end too: the frames the guest sends
// queue there. Even so, a write to the socket can fail with ENOBUFS on macOS
// when the guest is slow to read; the caller's writer should retry briefly
// rather than treat it as fatal.
func TuneDatagramSocket(f *os.File) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return fmt.Errorf("tune datagram socket %s: %w", f.Name(), err)
	}
	var opErr error
	if err := rc.Control(func(fd uintptr) { opErr = tuneDatagramFD(int(fd)) }); err != nil {
		return fmt.Errorf("tune datagram socket %s: %w", f.Name(), err)
	}
	if opErr != nil {
		return fmt.Errorf("tune datagram socket %s: %w", f.Name(), opErr)
	}
	return nil
}

// errNotDatagram means the network file is not a unix datagram socket.
var errNotDatagram = errors.New("not a connected unix SOCK_DGRAM socket (make it with socketpair(AF_UNIX, SOCK_DGRAM))")

func tuneDatagramFD(fd int) error {
	typ, err := syscall.GetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_TYPE)
	if err != nil {
		return fmt.Errorf("%w: %v", errNotDatagram, err)
	}
	if typ != syscall.SOCK_DGRAM {
		return errNotDatagram
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		return fmt.Errorf("%w: %v", errNotDatagram, err)
	}
	if _, ok := sa.(*syscall.SockaddrUnix); !ok {
		return errNotDatagram
	}
	if _, err := syscall.Getpeername(fd); errors.Is(err, syscall.ENOTCONN) {
		return fmt.Errorf("%w: it is not connected", errNotDatagram)
	}

	// The kernel may cap (and Linux doubles) the sizes asked for, so read
	// them back and shrink the send buffer until the ratio holds.
	var snd, rcv int
	for want := wantSndBuf; want >= minSndBuf; want /= 2 {
		if err := syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_SNDBUF, want); err != nil {
			continue
		}
		if err := syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4*want); err != nil {
			if err := syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_RCVBUF, 2*want); err != nil {
				continue
			}
		}
		if snd, err = syscall.GetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_SNDBUF); err != nil {
			return fmt.Errorf("read SO_SNDBUF: %w", err)
		}
		if rcv, err = syscall.GetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_RCVBUF); err != nil {
			return fmt.Errorf("read SO_RCVBUF: %w", err)
		}
		if rcv >= 2*snd {
			return nil
		}
	}
	return fmt.Errorf("cannot size socket buffers with SO_RCVBUF >= 2*SO_SNDBUF (got %d and %d): raise the system's socket buffer limit (kern.ipc.maxsockbuf)", rcv, snd)
}
