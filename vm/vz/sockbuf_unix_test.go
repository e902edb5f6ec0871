//go:build unix

package vz

import (
	"bytes"
	"errors"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// socketPair returns both ends of a connected AF_UNIX socket pair of typ.
func socketPair(t *testing.T, typ int) (a, b *os.File) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, typ, 0)
	if err != nil {
		t.Fatalf("socketpair: %v", err)
	}
	a, b = os.NewFile(uintptr(fds[0]), "vm-end"), os.NewFile(uintptr(fds[1]), "host-end")
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

func sockBufs(t *testing.T, f *os.File) (snd, rcv int) {
	t.Helper()
	rc, err := f.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var e1, e2 error
	rc.Control(func(fd uintptr) {
		snd, e1 = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_SNDBUF)
		rcv, e2 = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF)
	})
	if e1 != nil || e2 != nil {
		t.Fatalf("getsockopt: %v, %v", e1, e2)
	}
	return snd, rcv
}

func TestTuneDatagramSocket(t *testing.T) {
	t.Run("datagram pair", func(t *testing.T) {
		vmEnd, hostEnd := socketPair(t, syscall.SOCK_DGRAM)
		for _, f := range []*os.File{vmEnd, hostEnd} {
			if err := TuneDatagramSocket(f); err != nil {
				t.Fatalf("TuneDatagramSocket(%s): %v", f.Name(), err)
			}
			if snd, rcv := sockBufs(t, f); rcv < 2*snd {
				t.Errorf("%s: SO_RCVBUF %d < 2 * SO_SNDBUF %d", f.Name(), rcv, snd)
			}
		}
		// Frames still cross one per datagram, full-size ones intact.
		frame := bytes.Repeat([]byte{0xab}, 1514)
		small := []byte{1, 2, 3}
		for _, f := range [][]byte{frame, small} {
			if _, err := hostEnd.Write(f); err != nil {
				t.Fatalf("write frame: %v", err)
			}
		}
		buf := make([]byte, 65536)
		for _, want := range [][]byte{frame, small} {
			n, err := vmEnd.Read(buf)
			if err != nil {
				t.Fatalf("read frame: %v", err)
			}
			if !bytes.Equal(buf[:n], want) {
				t.Errorf("frame: got %d bytes, want %d", n, len(want))
			}
		}
	})

	refused := []struct {
		name string
		file func(t *testing.T) *os.File
	}{
		{"stream pair", func(t *testing.T) *os.File {
			a, _ := socketPair(t, syscall.SOCK_STREAM)
			return a
		}},
		{"unconnected datagram socket", func(t *testing.T) *os.File {
			c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: filepath.Join(t.TempDir(), "s"), Net: "unixgram"})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			f, err := c.File()
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { f.Close() })
			return f
		}},
		{"UDP socket on loopback", func(t *testing.T) *os.File {
			c, err := net.DialUDP("udp", nil, &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 9})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			f, err := c.File()
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { f.Close() })
			return f
		}},
		{"regular file", func(t *testing.T) *os.File {
			f, err := os.Create(filepath.Join(t.TempDir(), "not-a-socket"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { f.Close() })
			return f
		}},
	}
	for _, tt := range refused {
		t.Run(tt.name, func(t *testing.T) {
			err := TuneDatagramSocket(tt.file(t))
			if !errors.Is(err, errNotDatagram) {
				t.Errorf("TuneDatagramSocket: got %v, want errNotDatagram", err)
			}
		})
	}
}
