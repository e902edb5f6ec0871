package netstack

import (
	"net"
	"os"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// mmsgBatch is how many datagrams one recvmmsg or sendmmsg call moves at
// most.
const mmsgBatch = 64

// mmsgIO is the Linux frameIO: recvmmsg and sendmmsg move up to mmsgBatch
// frames per system call, which is what lets one core push more than a
// gigabit through 1500-byte frames.
type mmsgIO struct {
	rc syscall.RawConn

	rhdrs []unix.Mmsghdr
	riovs []unix.Iovec
	rbufs [][]byte
	rout  [][]byte

	whdrs []unix.Mmsghdr
	wiovs []unix.Iovec
}

// newFrameIO uses recvmmsg/sendmmsg when c exposes its descriptor, and
// plain reads and writes otherwise.
func newFrameIO(c net.Conn, frameSize int) frameIO {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return newConnIO(c, frameSize)
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return newConnIO(c, frameSize)
	}
	m := &mmsgIO{
		rc:    rc,
		rhdrs: make([]unix.Mmsghdr, mmsgBatch),
		riovs: make([]unix.Iovec, mmsgBatch),
		rbufs: make([][]byte, mmsgBatch),
		rout:  make([][]byte, 0, mmsgBatch),
		whdrs: make([]unix.Mmsghdr, mmsgBatch),
		wiovs: make([]unix.Iovec, mmsgBatch),
	}
	// One spare byte: a datagram that fills it is longer than a frame.
	backing := make([]byte, mmsgBatch*(frameSize+1))
	for i := range m.rhdrs {
		m.rbufs[i] = backing[i*(frameSize+1) : (i+1)*(frameSize+1) : (i+1)*(frameSize+1)]
		m.riovs[i].Base = &m.rbufs[i][0]
		m.riovs[i].SetLen(frameSize + 1)
		m.rhdrs[i].Hdr.Iov = &m.riovs[i]
		m.rhdrs[i].Hdr.SetIovlen(1)
		m.whdrs[i].Hdr.Iov = &m.wiovs[i]
		m.whdrs[i].Hdr.SetIovlen(1)
	}
	return m
}

func (m *mmsgIO) read() ([][]byte, error) {
	var n int
	var errno syscall.Errno
	err := m.rc.Read(func(fd uintptr) bool {
		for i := range m.rhdrs {
			m.rhdrs[i].Len = 0
			m.rhdrs[i].Hdr.Flags = 0
		}
		r, _, e := unix.Syscall6(unix.SYS_RECVMMSG, fd, uintptr(unsafe.Pointer(&m.rhdrs[0])),
			uintptr(len(m.rhdrs)), unix.MSG_DONTWAIT, 0, 0)
		switch e {
		case unix.EAGAIN, unix.EINTR:
			return false // wait until readable (or the deadline)
		}
		n, errno = int(r), e
		return true
	})
	if err != nil {
		return nil, err
	}
	if errno != 0 {
		return nil, os.NewSyscallError("recvmmsg", errno)
	}
	m.rout = m.rout[:0]
	for i := range n {
		l := int(m.rhdrs[i].Len)
		if m.rhdrs[i].Hdr.Flags&unix.MSG_TRUNC != 0 {
			l = len(m.rbufs[i]) // truncated: report it as too long
		}
		m.rout = append(m.rout, m.rbufs[i][:l])
	}
	return m.rout, nil
}

func (m *mmsgIO) write(frames [][]byte) (int, error) {
	sent, nobufs := 0, 0
	for sent < len(frames) {
		batch := frames[sent:min(len(frames), sent+mmsgBatch)]
		for i, f := range batch {
			m.wiovs[i].Base = &f[0]
			m.wiovs[i].SetLen(len(f))
		}
		var n int
		var errno syscall.Errno
		err := m.rc.Write(func(fd uintptr) bool {
			r, _, e := unix.Syscall6(unix.SYS_SENDMMSG, fd, uintptr(unsafe.Pointer(&m.whdrs[0])),
				uintptr(len(batch)), unix.MSG_DONTWAIT, 0, 0)
			switch e {
			case unix.EAGAIN, unix.EINTR:
				return false // wait until writable (or the deadline)
			}
			n, errno = int(r), e
			return true
		})
		if err != nil {
			return sent, err
		}
		switch {
		case errno == unix.EMSGSIZE:
			sent++ // the first frame of the batch is too big for the socket: drop it
		case errno == unix.ENOBUFS && nobufs < 12:
			nobufs++
			time.Sleep(50 * time.Microsecond)
		case errno != 0:
			return sent, os.NewSyscallError("sendmmsg", errno)
		default:
			sent += n
		}
	}
	return sent, nil
}
