//go:build unix

package netstack

import (
	"fmt"
	"net"
	"os"
	"syscall"
)

// Socket buffer sizes of the frame socket pair. The receive buffer is 4×
// the send buffer, as Apple recommends for file-handle network
// attachments; the kernel may cap both (Linux: net.core.wmem_max and
// rmem_max).
const (
	frameSndBuf = 1 << 20
	frameRcvBuf = 4 << 20
)

// SocketPair makes the link between the guest's NIC and a Stack: a
// connected AF_UNIX SOCK_DGRAM pair, one Ethernet frame per datagram. host
// goes to Stack.Serve; vm to the hypervisor (vm.Network.Conn: QEMU's
// "-netdev dgram" with a file descriptor, vz's file-handle attachment).
// The caller closes both. Both ends are close-on-exec; pass vm to a child
// process explicitly (exec.Cmd.ExtraFiles).
func SocketPair() (host net.Conn, vm *os.File, err error) {
	// Hold ForkLock so no child process inherits the pair before it is
	// marked close-on-exec (not every platform has SOCK_CLOEXEC).
	syscall.ForkLock.RLock()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_DGRAM, 0)
	if err == nil {
		syscall.CloseOnExec(fds[0])
		syscall.CloseOnExec(fds[1])
	}
	syscall.ForkLock.RUnlock()
	if err != nil {
		return nil, nil, fmt.Errorf("create the guest network socket pair: %w", err)
	}
	for _, fd := range fds {
		// Best effort: a kernel that caps the sizes still works, slower.
		_ = syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_SNDBUF, frameSndBuf)
		_ = syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_RCVBUF, frameRcvBuf)
	}
	hf := os.NewFile(uintptr(fds[0]), "vibedom-net-host")
	vm = os.NewFile(uintptr(fds[1]), "vibedom-net-vm")
	host, err = net.FileConn(hf)
	hf.Close() // FileConn made its own copy of the descriptor
	if err != nil {
		vm.Close()
		return nil, nil, fmt.Errorf("wrap the guest network socket: %w", err)
	}
	return host, vm, nil
}
