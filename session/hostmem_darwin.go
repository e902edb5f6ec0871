package session

import "golang.org/x/sys/unix"

// availableMemoryMiB is the host's physical memory less a reserve for macOS
// itself: macOS does not report "available" memory the way Linux does, and
// Virtualization.framework commits guest memory lazily.
func availableMemoryMiB() (int, error) {
	n, err := unix.SysctlUint64("hw.memsize")
	if err != nil {
		return 0, err
	}
	return int(n/(1<<20)) - 2048, nil
}
