//go:build !linux

package qemu

import "syscall"

// procAttr puts QEMU in its own process group. Without Pdeathsig (Linux
// only) a crashed vibedom can leave QEMU running; Stop and the session's
// pid file are what clean it up there.
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
