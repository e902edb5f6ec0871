//go:build darwin && arm64

package vz

/*
#cgo CFLAGS: -fno-objc-arc
#cgo LDFLAGS: -framework Foundation -framework Virtualization
#include <stdint.h>
#include <stdlib.h>
int vibedomVsockConnect(void *device, void *queue, uint32_t port, int64_t timeoutMs, char **errOut, char **domainOut, long *codeOut);
*/
import "C"

import (
	"fmt"
	"net"
	"os"
	"syscall"
	"time"
	"unsafe"

	vz "github.com/Code-Hex/vz/v3"
)

// vzSocketDevice mirrors the fields of vz v3.7.1's VirtioSocketDevice: the
// VM's dispatch queue, then the embedded objc pointer whose only field is
// the VZVirtioSocketDevice. vz exports no accessor for either, and its own
// Connect double-closes a descriptor (vsock_darwin_arm64.m says how), so
// vibedom reads them to make the call itself.
type vzSocketDevice struct {
	queue unsafe.Pointer
	obj   *struct{ ptr unsafe.Pointer }
}

// A change of vz's layout breaks the build here (and in tools/check-darwin
// on Linux) rather than reading the wrong memory: the sizes must match, and
// so must the pinned version (go.mod) this layout was read from.
var _ = [1]int{}[unsafe.Sizeof(vz.VirtioSocketDevice{})-unsafe.Sizeof(vzSocketDevice{})]

// vsockConnectTimeout bounds one attempt; dialRetry makes the next.
const vsockConnectTimeout = 10 * time.Second

// vsockConnect opens a connection to port on dev. The framework keeps and
// closes its own descriptor; the returned connection holds vibedom's
// duplicate.
func vsockConnect(dev *vz.VirtioSocketDevice, port uint32) (net.Conn, error) {
	d := (*vzSocketDevice)(unsafe.Pointer(dev))
	if d.queue == nil || d.obj == nil || d.obj.ptr == nil {
		return nil, fmt.Errorf("vsock connect to port %d: the socket device is not initialised", port)
	}
	var cerr, cdomain *C.char
	var code C.long
	fd := C.vibedomVsockConnect(d.obj.ptr, d.queue, C.uint32_t(port), C.int64_t(vsockConnectTimeout.Milliseconds()), &cerr, &cdomain, &code)
	if fd < 0 {
		msg, domain := C.GoString(cerr), C.GoString(cdomain)
		C.free(unsafe.Pointer(cerr))
		C.free(unsafe.Pointer(cdomain))
		err := fmt.Errorf("vsock connect to port %d: %s (%s %d)", port, msg, domain, int64(code))
		if domain == "NSPOSIXErrorDomain" && code > 0 {
			err = fmt.Errorf("vsock connect to port %d: %w", port, syscall.Errno(code))
		}
		return nil, err
	}
	f := os.NewFile(uintptr(fd), fmt.Sprintf("vsock:%d", port))
	defer f.Close() // net.FileConn holds its own duplicate
	c, err := net.FileConn(f)
	if err != nil {
		return nil, fmt.Errorf("vsock connect to port %d: %w", port, err)
	}
	return c, nil
}
