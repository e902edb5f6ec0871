package qemu

import "syscall"

// procAttr puts QEMU in its own process group and has the kernel kill it
// if vibedom dies, so no VM outlives the session that started it.
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
